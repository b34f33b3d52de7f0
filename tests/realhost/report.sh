#!/usr/bin/env bash
# Puts a day's real-host runs (bench/results/realhost/DATE/report-s*.md,
# each written by tests/realhost/run.sh) together into
# bench/results/DATE-real-host.md, newest run of each scenario last wins.
#   tests/realhost/report.sh [DATE]
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
date=${1:-$(date +%F)}
raw=$repo/bench/results/realhost/$date
out=$repo/bench/results/$date-real-host.md
python3 - "$raw" "$out" <<'PY'
import glob, os, re, sys
raw, out = sys.argv[1], sys.argv[2]
runs = sorted(glob.glob(os.path.join(raw, 'report-s*.md')), key=os.path.getmtime)
if not runs:
    sys.exit(f'report.sh: no {raw}/report-s*.md')
sections, heads = {}, []
for r in runs:
    text = open(r).read()
    head, _, body = text.partition('\n## ')
    heads.append((os.path.basename(r), head.strip()))
    for part in re.split(r'\n(?=## )', '## ' + body if body else ''):
        m = re.match(r'## (\d)\.', part)
        if m:
            sections[m.group(1)] = (os.path.basename(r), part.strip())
with open(out, 'w') as f:
    f.write(f'# Real host: issue 27\'s scenarios on virtio-net ({os.path.basename(raw)})\n\n')
    f.write('Put together by tests/realhost/report.sh from the runs below (each written by `make real-host`,\n')
    f.write('tests/realhost/run.sh); a scenario run more than once shows its last run. Raw output of every run:\n')
    f.write(f'bench/results/realhost/{os.path.basename(raw)}/.\n\n')
    for name, head in heads:
        f.write(f'### Run {name}\n\n' + '\n'.join(head.split('\n')[2:]).strip() + '\n\n')
    for k in sorted(sections):
        name, part = sections[k]
        f.write(part.replace('\n', '\n', 1) + f'\n\n(from {name})\n\n')
print(out)
PY
