"""Qwen-Image's flow-matching scheduler settings (scheduler/scheduler_config.json of Qwen/Qwen-Image).

Single-file model sets carry no scheduler config, so this default is used there; a diffusers
directory's own scheduler config wins when present.
"""

QWEN_IMAGE_SCHEDULER_CONFIG = {
    "base_image_seq_len": 256,
    "base_shift": 0.5,
    "invert_sigmas": False,
    "max_image_seq_len": 8192,
    "max_shift": 0.9,
    "num_train_timesteps": 1000,
    "shift": 1.0,
    "shift_terminal": 0.02,
    "stochastic_sampling": False,
    "time_shift_type": "exponential",
    "use_beta_sigmas": False,
    "use_dynamic_shifting": True,
    "use_exponential_sigmas": False,
    "use_karras_sigmas": False,
}


def resolution_mu(image_tokens: int, scheduler_config: dict) -> float:
    """The pipeline's mu for an image of `image_tokens` packed tokens."""
    from diffusers.pipelines.qwenimage.pipeline_qwenimage import calculate_shift

    return calculate_shift(
        image_tokens,
        scheduler_config.get("base_image_seq_len", 256),
        scheduler_config.get("max_image_seq_len", 4096),
        scheduler_config.get("base_shift", 0.5),
        scheduler_config.get("max_shift", 1.15),
    )
