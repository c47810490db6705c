"""The GPUs the timeline models know by name: data-sheet peaks and host links (planner/timeline.py runs its model on
them; `profile_for_device` finds one from torch's device name)."""

from __future__ import annotations

from dataclasses import dataclass

# PCIe per direction, raw: lanes x rate x 128/130 (PCI-SIG base specifications 3.0, 4.0, 5.0), in GB/s.
PCIE3_X16, PCIE4_X8, PCIE4_X16, PCIE5_X16 = 15.75, 15.75, 31.5, 63.0


@dataclass(frozen=True)
class GpuProfile:
    name: str
    label: str
    bf16_tflops: float  # dense tensor TFLOPS, bf16 in, fp32 accumulate (data-sheet peak)
    fp8_tflops: float  # dense tensor TFLOPS, float8 in, fp32 accumulate (0: no float8 tensor cores)
    fp32_tflops: float  # non-tensor fp32 peak (torch runs fp32 matmuls there: TF32 is off by default)
    memory_gbs: float  # device memory bandwidth, GB/s
    link_gbs: float  # host link per direction, raw GB/s
    link: str
    source: str
    # Dense int8 tensor TOPS, int32 accumulate (0: not known). Provisional data-sheet peaks until a device check measures
    # the int8 GEMMs (benchmarks/int8_compute_rates.py `int8_gemm_rates`): 2x fp8's on Ampere and Ada GeForce (whose
    # bf16 with fp32 accumulate runs at half rate) and Blackwell RTX, equal to fp8's on Hopper.
    int8_tops: float = 0.0


# Sources: NVIDIA Ampere GA102 whitepaper (RTX 3090: 35.6 bf16/fp32-acc, 35.6 fp32, 936 GB/s), Ada Lovelace
# whitepaper appendix (RTX 4090: 165.2 bf16, 330.3 fp8 with fp32 accumulate, 82.6 fp32, 1008 GB/s), RTX 4060 Ti
# product page (22.1 fp32, 353 "AI TOPS" = fp8 sparse: dense bf16/fp32-acc 353 / 2 / 2 / 2 = 44.1, 288 GB/s, PCIe 4.0
# x8 electrically), Blackwell RTX whitepaper (RTX 5090: 209.5 bf16, 419 fp8 with fp32 accumulate, 104.8 fp32,
# 1792 GB/s), H100 datasheet (SXM5: 989.4 bf16, 1978.9 fp8, 66.9 fp32, 3350 GB/s; host link PCIe 5.0 x16). int8 dense
# TOPS from the same documents (3090 284.7, 4090 660.6, 5090 838, H100 1978.9; the 4060 Ti at 4x its bf16).
GPUS: dict[str, GpuProfile] = {g.name: g for g in (
    GpuProfile("rtx3090", "RTX 3090, PCIe 4 x16", 35.6, 0.0, 35.6, 936, PCIE4_X16, "PCIe 4.0 x16", "GA102 whitepaper",
               int8_tops=284.7),
    GpuProfile("rtx4060ti-16gb", "RTX 4060 Ti 16 GB, PCIe 4 x8", 44.1, 88.2, 22.1, 288, PCIE4_X8, "PCIe 4.0 x8",
               "RTX 4060 Ti product page", int8_tops=176.4),
    GpuProfile("rtx4090", "RTX 4090, PCIe 4 x16", 165.2, 330.3, 82.6, 1008, PCIE4_X16, "PCIe 4.0 x16",
               "Ada whitepaper", int8_tops=660.6),
    GpuProfile("rtx4090-pcie3", "RTX 4090, PCIe 3 x16 (or PCIe 4 x8)", 165.2, 330.3, 82.6, 1008, PCIE3_X16,
               "PCIe 3.0 x16", "Ada whitepaper", int8_tops=660.6),
    GpuProfile("rtx5090", "RTX 5090, PCIe 5 x16", 209.5, 419.0, 104.8, 1792, PCIE5_X16, "PCIe 5.0 x16",
               "Blackwell RTX whitepaper", int8_tops=838.0),
    GpuProfile("h100", "H100 SXM5, PCIe 5 x16 host link", 989.4, 1978.9, 66.9, 3350, PCIE5_X16, "PCIe 5.0 x16",
               "H100 datasheet", int8_tops=1978.9),
    # H200 datasheet: the H100's compute, HBM3e at 4800 GB/s; host link PCIe 5.0 x16.
    GpuProfile("h200", "H200 SXM, PCIe 5 x16 host link", 989.4, 1978.9, 66.9, 4800, PCIE5_X16, "PCIe 5.0 x16",
               "H200 datasheet", int8_tops=1978.9),
)}

# Substrings of torch.cuda.get_device_name() -> profile (the first that matches; gpu_check uses it).
DEVICE_NAMES = (("H200", "h200"), ("H100", "h100"), ("5090", "rtx5090"), ("4090", "rtx4090"),
                ("4060 Ti", "rtx4060ti-16gb"), ("3090", "rtx3090"))


def profile_for_device(name: str) -> GpuProfile | None:
    return next((GPUS[key] for part, key in DEVICE_NAMES if part in name), None)
