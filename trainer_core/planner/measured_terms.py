"""The plan's terms that are not counted tensor by tensor, each named, with the measurement that set it (the table in
benchmarks/README.md, "Measured plan terms"). Where a term is uncertain it errs up, and its comment says by how much:
the plan is never short. Measured once, on one card (an H100, 6 December, `benchmarks/device_results/
h100_2026-12-06.md`): provisional until the next device check measures them again.
"""

from __future__ import annotations

GIB = 1024 ** 3
MIB = 1024 ** 2

CUDA_CONTEXT_BYTES = 512 * MIB  # CUDA context + cuBLAS workspace: outside torch's allocator (H100: 526.8 MiB measured)
# Caching-allocator rounding and fragmentation, as a share of allocated bytes: reserved over allocated measured 2.3-6.6%
# in the H100 run's init, train and save phases (6 December); 7% errs up by 0.4 points. (Its whole-decode previews
# reached 7.3%; under the decision rule of device.room_now those previews now decode in tiles.)
ALLOCATOR_SLACK = 0.07
# Resident memory of a Python process after importing torch, diffusers, transformers, peft and bitsandbytes:
# 0.38-0.40 GiB measured on the CPU build (command in benchmarks/README.md), 1 GiB assumed there.
PROCESS_BASELINE_BYTES = GIB
# On CUDA, cuBLAS, cuDNN, FlashAttention and bitsandbytes' CUDA library are loaded by the first step: the H100 run's
# phases after the first step held 0.63-0.77 GiB more host memory than the 1 GiB assumed (measured once: provisional
# until a second card measures it); 1.8 GiB errs up by 0.03 GiB over the largest.
CUDA_PROCESS_BASELINE_BYTES = int(1.8 * GIB)
# The save phase on CUDA allocated 0.136-0.184 GiB more than its tensors (the LoRA file's tensors cast on the device
# before their copy off it, and the safetensors writer's); 200 MiB errs up by 0.011 GiB.
SAVE_RESIDUE_BYTES = 200 * MIB
