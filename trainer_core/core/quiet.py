"""Library messages that read like errors but are not, kept from the log.

bitsandbytes logs, on CPUs with AVX512-BF16, "Failed to load CPU gemm_4bit_forward from kernels-community: No
module named 'kernels'" when it is first imported (peft imports it, and so does 8-bit AdamW). That kernel is its
4-bit matmul, which nothing here uses; the message read like an error at the first step. Only that message is
dropped: every other message of the same logger still shows.
"""

from __future__ import annotations

import logging

BITSANDBYTES_CPU_OPS = "bitsandbytes.backends.cpu.ops"


class _Not4BitKernel(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "gemm_4bit_forward" not in record.getMessage()


def quiet_library_messages() -> None:
    """Install the filter once (the engine's package does so when it is imported, before peft or bitsandbytes)."""
    logger = logging.getLogger(BITSANDBYTES_CPU_OPS)
    if not any(isinstance(f, _Not4BitKernel) for f in logger.filters):
        logger.addFilter(_Not4BitKernel())
