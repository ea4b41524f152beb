#!/usr/bin/env python3
"""Carry groups for the device tool: the files of DIR in bins of at most 64 MiB less what else
travels with each call (the working tree's tracked and untracked-not-ignored files, and shared/
if the checkout has one) less 1 MiB.

    python3 scripts/carry_groups.py DIR            # first fit, largest first
    python3 scripts/carry_groups.py DIR ORDER      # in the order of the file ORDER (one name a
                                                   # line), a new bin when the next file does not fit

Writes DIR/groups.txt (one line of file names per call) and DIR/manifest.txt ("size name" of
every file, which the receiving side checks). Run from the repository root.
"""
import os
import subprocess
import sys

d = sys.argv[1]
order = sys.argv[2] if len(sys.argv) > 2 else None
tree = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                      capture_output=True, check=True).stdout.split(b"\0")
# Each file counted in whole 4 KiB blocks, as the device tool's limit counts it (with ~700 small
# files, apparent sizes undercount by ~2 MiB and a 56 MiB group was refused).
blk = lambda f: -(-os.path.getsize(f) // 4096) * 4096  # noqa: E731
tree_bytes = sum(blk(f) for f in tree if f and os.path.isfile(f))
for root, _, fs in os.walk("shared"):
    tree_bytes += sum(blk(os.path.join(root, f)) for f in fs)
limit = (64 << 20) - tree_bytes - (1 << 20)
print(f"working tree {tree_bytes / 2**20:.1f} MiB: carry groups of at most {limit / 2**20:.1f} MiB")
skip = {"groups.txt", "manifest.txt", os.path.basename(order or "")}
names = sorted(f for f in os.listdir(d) if f not in skip and os.path.isfile(os.path.join(d, f)))
with open(os.path.join(d, "manifest.txt"), "w") as m:
    for f in names:
        m.write(f"{os.path.getsize(os.path.join(d, f))} {f}\n")
size = {f: os.path.getsize(os.path.join(d, f)) for f in names}
too_big = [f for f in names if size[f] > limit]
if too_big:
    sys.exit(f"files larger than a carry group ({limit / 2**20:.1f} MiB): {' '.join(too_big)}")
bins = []
if order:
    listed = [ln.strip() for ln in open(order) if ln.strip()]
    missing = [f for f in listed if f not in size]
    if missing:
        sys.exit(f"{order} names files not in {d}: {' '.join(missing)}")
    for f in listed:
        if not bins or bins[-1][0] + size[f] > limit:
            bins.append([0, []])
        bins[-1][0] += size[f]
        bins[-1][1].append(f)
else:
    for f in sorted(names, key=lambda f: size[f], reverse=True):
        for b in bins:
            if b[0] + size[f] <= limit:
                b[0] += size[f]
                b[1].append(f)
                break
        else:
            bins.append([size[f], [f]])
with open(os.path.join(d, "groups.txt"), "w") as g:
    for _, fs in bins:
        g.write(" ".join(fs) + "\n")
print(f"{len(bins)} carry groups:")
for total, fs in bins:
    print(f"  {total / 2**20:5.1f} MiB: {' '.join(fs)}")
