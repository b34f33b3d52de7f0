//go:build linux

package api

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// ErrInUse means another live process serves the API socket.
var ErrInUse = errors.New("another xlimit daemon serves the API socket")

// Server timeouts and limits.
const (
	readHeaderTimeout = 5 * time.Second
	readTimeout       = 30 * time.Second
	writeTimeout      = 30 * time.Second
	idleTimeout       = 2 * time.Minute
	maxHeaderBytes    = 64 << 10
	shutdownTimeout   = 2 * time.Second
	probeTimeout      = time.Second
	// maxSocketPath is sizeof(sun_path) less the terminating NUL.
	maxSocketPath = 107
)

// Server is the API served on a unix socket.
type Server struct {
	path string
	log  *slog.Logger
	srv  *http.Server
	ln   *net.UnixListener
	sock os.FileInfo // the socket file we created, to remove only ours
	lock *os.File    // flock on PATH.lock, held while serving

	done      chan struct{} // closed when Serve returned
	closeOnce sync.Once
	closeErr  error
}

// Start serves the API for d on the unix socket path and returns at once;
// Close stops it. The socket's directory is created with mode 0700 if
// missing; the socket is created with mode 0600 under a temporary name and
// renamed into place, so it never exists with a wider mode, and a stale
// socket left by a dead daemon is replaced. Start refuses (ErrInUse) when
// another daemon holds PATH.lock or answers on the socket, and refuses to
// replace anything at path that is not a socket. Connections from peers
// other than root and the daemon's own user are closed unanswered. log may
// be nil.
func Start(path string, d Daemon, log *slog.Logger) (*Server, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{path: filepath.Clean(path), log: log, done: make(chan struct{})}
	if err := s.listen(); err != nil {
		return nil, err
	}
	s.srv = &http.Server{
		Handler:           Handler(d, log),
		ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout:       readTimeout,
		WriteTimeout:      writeTimeout,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(peerCheckListener{s.ln, log}); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("api: server stopped", "socket", s.path, "err", err)
		}
	}()
	log.Info("serving the API", "socket", s.path)
	return s, nil
}

// Path returns the socket's path.
func (s *Server) Path() string { return s.path }

// Close stops accepting, lets requests in flight finish (for up to 2 s),
// removes the socket if it is still the one Start created, and releases
// the lock. It is idempotent.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
		defer cancel()
		var errs []error
		if err := s.srv.Shutdown(ctx); err != nil {
			// Requests still in flight (or a client that stalls half-way
			// through one) must not hold up or fail the daemon's exit.
			s.log.Warn("api: closing connections still open after the grace period", "err", err)
			_ = s.srv.Close()
		}
		<-s.done
		if fi, err := os.Lstat(s.path); err == nil && os.SameFile(fi, s.sock) {
			if err := os.Remove(s.path); err != nil {
				errs = append(errs, fmt.Errorf("remove API socket: %w", err))
			}
		}
		errs = append(errs, s.lock.Close()) // closing releases the flock
		s.closeErr = errors.Join(errs...)
	})
	return s.closeErr
}

func (s *Server) listen() (err error) {
	if len(s.path) > maxSocketPath {
		return fmt.Errorf("listen on API socket %s: path longer than %d bytes", s.path, maxSocketPath)
	}
	dir := filepath.Dir(s.path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create API socket directory: %w", err)
	}
	if s.lock, err = lockFile(s.path + ".lock"); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			s.lock.Close()
		}
	}()
	if err := s.checkExisting(); err != nil {
		return err
	}

	// Bind under a temporary name, restrict, then rename over the final
	// name (atomically replacing a stale socket).
	tmp := filepath.Join(dir, fmt.Sprintf(".%s.%d.tmp", filepath.Base(s.path), os.Getpid()))
	if err := os.Remove(tmp); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove leftover %s: %w", tmp, err)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: tmp, Net: "unix"})
	if err != nil {
		return fmt.Errorf("listen on API socket: %w", err)
	}
	ln.SetUnlinkOnClose(false) // Close removes the final name, and only if it is still ours
	fail := func(err error) error {
		ln.Close()
		os.Remove(tmp)
		return err
	}
	if err := os.Chmod(tmp, 0o600); err != nil {
		return fail(fmt.Errorf("restrict API socket: %w", err))
	}
	if err := os.Rename(tmp, s.path); err != nil {
		return fail(fmt.Errorf("move API socket into place: %w", err))
	}
	if s.sock, err = os.Lstat(s.path); err != nil {
		return fail(fmt.Errorf("stat API socket: %w", err))
	}
	s.ln = ln
	return nil
}

// checkExisting refuses when path is something other than a socket or a
// live process answers on it; a dead socket is left for the rename to
// replace.
func (s *Server) checkExisting() error {
	fi, err := os.Lstat(s.path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("stat API socket: %w", err)
	}
	if fi.Mode()&os.ModeSocket == 0 {
		return fmt.Errorf("listen on API socket: %s exists and is not a socket; refusing to replace it", s.path)
	}
	c, err := net.DialTimeout("unix", s.path, probeTimeout)
	if err == nil {
		c.Close()
		return fmt.Errorf("%w: %s answers", ErrInUse, s.path)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("probe existing API socket %s: %w", s.path, err)
	}
	s.log.Info("replacing a stale API socket", "socket", s.path)
	return nil
}

// lockFile takes an exclusive, non-blocking flock on path (created 0600).
func lockFile(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open API socket lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s is locked", ErrInUse, path)
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	return f, nil
}

// peerCheckListener closes connections from anyone but root and our own
// user: the socket's mode already says so, this holds even if the mode is
// changed or a peer connected in the instant before the chmod.
type peerCheckListener struct {
	*net.UnixListener
	log *slog.Logger
}

func (l peerCheckListener) Accept() (net.Conn, error) {
	for {
		c, err := l.AcceptUnix()
		if err != nil {
			return nil, err
		}
		uid, err := peerUID(c)
		if err == nil && (uid == 0 || uid == uint32(os.Geteuid())) {
			return c, nil
		}
		l.log.Warn("api: refused a connection", "peer_uid", uid, "err", err)
		c.Close()
	}
}

func peerUID(c *net.UnixConn) (uint32, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, fmt.Errorf("peer credentials: %w", err)
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return 0, fmt.Errorf("peer credentials: %w", err)
	}
	if cerr != nil {
		return 0, fmt.Errorf("peer credentials: %w", cerr)
	}
	return cred.Uid, nil
}
