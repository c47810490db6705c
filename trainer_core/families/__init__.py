"""Model families: what differs between Qwen-Image text-to-image, Qwen-Image-Edit and the families to come."""
