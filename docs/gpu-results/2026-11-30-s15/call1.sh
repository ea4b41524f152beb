# Call 1 of session 15 ran docs/gpu-results/2026-11-30-s14/next-call1.sh unchanged (copied to
# target/gpu-data/quick/c1.sh).
