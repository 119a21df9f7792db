# Shared preamble of the device scripts (bench/run_*.sh); each does `. "$(dirname "$0")/lib.sh"` after its
# own defaults. Sets: OUT (default out, created), BIN (prebuilt binaries, default .carry-bin, first on
# LD_LIBRARY_PATH), DEADLINE (DEADLINE_S, else the script's DEFAULT_DEADLINE, else 580 s), S (the run's
# summary, $OUT/summary.txt or $OUT/$SUMMARY_NAME, started with the date and the GPUs), t0; functions left (seconds to DEADLINE) and stamp MSG
# (a timed line in S). ZIPAGE_TEST_MODEL points the GPU tests at the bundled stories260K.
OUT=${OUT:-out}
BIN=${BIN:-.carry-bin}
DEADLINE=${DEADLINE_S:-${DEFAULT_DEADLINE:-580}}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/$BIN:${LD_LIBRARY_PATH:-}" PYTHONUNBUFFERED=1
export ZIPAGE_TEST_MODEL="${ZIPAGE_TEST_MODEL:-$PWD/models/stories260K.gguf}"
S="$OUT/${SUMMARY_NAME:-summary.txt}"
t0=$(date +%s)
left() { echo $((DEADLINE - ($(date +%s) - t0))); }
stamp() { echo "[$(($(date +%s) - t0)) s] $*" >> "$S"; }
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"; } > "$S"
