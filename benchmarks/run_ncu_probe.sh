#!/usr/bin/env bash
# Nsight Compute on the kernels that miss issue 4's targets and their baselines (benchmarks/ncu_probe.py);
# reports under $OUT (ncu_gate_up.txt, ncu_decode.txt, ncu_gemv.txt). Usage (repo root, GPU machine): bash benchmarks/run_ncu_probe.sh
cd "$(dirname "$0")/.." || exit 1
OUT="${OUT:-benchmarks/results}"
mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -1
SECTIONS=(--section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy
          --section LaunchStats)
ncu --clock-control none "${SECTIONS[@]}" --launch-skip 2 --launch-count 2 -k 'regex:_gated_up_gemm_kernel|nvjet' \
  python3 benchmarks/ncu_probe.py gate_up > "$OUT/ncu_gate_up.txt" 2>&1
ncu --clock-control none "${SECTIONS[@]}" --launch-skip 2 --launch-count 2 -k 'regex:_decode_split_kernel|flash|fmha' \
  python3 benchmarks/ncu_probe.py decode > "$OUT/ncu_decode.txt" 2>&1
ncu --clock-control none "${SECTIONS[@]}" --section SchedulerStats --launch-skip 4 --launch-count 4 \
  -k 'regex:_gemv_kernel|gemv|nvjet' python3 benchmarks/ncu_probe.py gemv > "$OUT/ncu_gemv.txt" 2>&1
for f in "$OUT/ncu_gate_up.txt" "$OUT/ncu_decode.txt" "$OUT/ncu_gemv.txt"; do
  echo "== $f"
  grep -E "^  [_a-zA-Z].*\(|Duration|DRAM Throughput|L2 Cache Throughput|L1/TEX Cache Throughput|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Stall|L2 Hit Rate|Block Limit|Waves Per SM|ERROR|error" "$f" | head -60
done
