"""The VRAM and host-RAM planner (placeholder, filled in the next commit)."""
