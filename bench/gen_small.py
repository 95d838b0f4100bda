#!/usr/bin/env python3
"""gen_small.py DIR SHAPE: the small-file benchmark's datasets (bench_small.sh), made once.

  imagenet  50,000 files in 1,000 folders, sizes drawn around 110 KB (40-180 KB, mean ~110 KB),
            as the ImageNet training set's JPEGs are.
  tiny      200,000 files in 200 folders of 1-4 KB, as text and audio snippet sets are.
Contents are pseudo-random (incompressible) and deterministic; FILES overrides the count.
"""
import os
import random
import sys


def main():
    root, shape = sys.argv[1], sys.argv[2]
    if shape == "imagenet":
        files, folders, lo, hi = 50_000, 1_000, 40_000, 180_000
    elif shape == "tiny":
        files, folders, lo, hi = 200_000, 200, 1_024, 4_096
    else:
        sys.exit(f"gen_small.py: unknown shape {shape!r} (imagenet or tiny)")
    files = int(os.environ.get("FILES", files))
    rng = random.Random(shape)
    pool = random.Random(7).randbytes(1 << 22)  # slices of 4 MiB of random bytes
    per = (files + folders - 1) // folders
    total = 0
    for i in range(files):
        d = os.path.join(root, f"n{i // per:05d}")
        if i % per == 0:
            os.makedirs(d, exist_ok=True)
        # Triangular around the middle: most files near the mean, a few small and large.
        size = int(rng.triangular(lo, hi, (lo + hi) / 2))
        start = rng.randrange(0, len(pool) - size)
        with open(os.path.join(d, f"{i:08d}.bin"), "wb") as f:
            f.write(pool[start:start + size])
        total += size
        if i % 20_000 == 0:
            print(f"gen_small: {shape} {i}/{files} files", file=sys.stderr)
    print(f"gen_small: {shape}: {files} files, {total} bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
