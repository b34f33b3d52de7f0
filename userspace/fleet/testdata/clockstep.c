// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// clockstep.so: an LD_PRELOAD shim that steps a process's wall clock.
// The tests of the fleet store run redis-server under it: the realtime
// clock (clock_gettime, gettimeofday, time) reads the kernel's plus an
// offset in nanoseconds, read on every call from the first 8 bytes of the
// file named by XL_CLOCK_OFFSET (a little-endian int64, mapped shared), so
// a test steps Redis's TIME back or forward by writing the file. It calls
// the kernel directly (no dlsym: redis-server's jemalloc calls the clock
// while libc's loader would allocate, which is what defeats libfaketime).
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static volatile int64_t *offset_ns;

static int64_t offset(void)
{
	if (!offset_ns) {
		const char *path = getenv("XL_CLOCK_OFFSET");
		int fd = path ? open(path, O_RDONLY | O_CLOEXEC) : -1;
		void *m =
		    fd < 0 ? MAP_FAILED : mmap(0, sizeof(int64_t), PROT_READ, MAP_SHARED, fd, 0);

		if (fd >= 0)
			close(fd);
		if (m == MAP_FAILED)
			return 0;
		offset_ns = m;
	}
	return *offset_ns;
}

int clock_gettime(clockid_t id, struct timespec *ts)
{
	int r = syscall(SYS_clock_gettime, id, ts);

	if (r == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) {
		int64_t ns = (int64_t)ts->tv_sec * 1000000000 + ts->tv_nsec + offset();

		ts->tv_sec = ns / 1000000000;
		ts->tv_nsec = ns % 1000000000;
	}
	return r;
}

int gettimeofday(struct timeval *tv, void *tz)
{
	struct timespec ts;
	int r = clock_gettime(CLOCK_REALTIME, &ts);

	(void)tz;
	if (r == 0 && tv) {
		tv->tv_sec = ts.tv_sec;
		tv->tv_usec = ts.tv_nsec / 1000;
	}
	return r;
}

time_t time(time_t *t)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	if (t)
		*t = ts.tv_sec;
	return ts.tv_sec;
}
