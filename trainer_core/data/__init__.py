"""Training data: image folders and buckets (images.py), the content-keyed cache (cache.py), the data order (order.py)."""
