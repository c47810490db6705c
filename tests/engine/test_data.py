"""Dataset discovery, aspect buckets and crops."""

from conftest import tiny_dataset_config
from trainer_core.core.config import DatasetConfig
from trainer_core.data.images import bucket_sizes, choose_bucket, discover, load_cropped


def test_buckets_are_multiples_of_32_near_the_target_area():
    cfg = DatasetConfig(folder="x", resolution=1024)
    sizes = bucket_sizes(cfg)
    assert (1024, 1024) in sizes
    for w, h in sizes:
        assert w % 32 == 0 and h % 32 == 0
        assert 0.85 < (w * h) / 1024**2 <= 1.0
    assert choose_bucket(1920, 1080, sizes)[0] > choose_bucket(1920, 1080, sizes)[1]
    assert choose_bucket(500, 500, sizes) == (1024, 1024)


def test_discover_pairs_images_with_captions_and_buckets(demo_folder):
    samples = discover(tiny_dataset_config(demo_folder))
    assert len(samples) == 8
    assert samples[0].caption == "a red circle on a white background"
    assert {s.bucket for s in samples} == {(64, 64), (96, 32)}  # seven squares, one 2:1 image
    assert len({s.image_sha256 for s in samples}) == 8


def test_crop_covers_the_bucket(demo_folder):
    sample = discover(tiny_dataset_config(demo_folder))[7]  # the wide image
    pixels = load_cropped(sample.image_path, sample.bucket)
    assert pixels.shape == (3, sample.bucket[1], sample.bucket[0])
    assert -1.0 <= pixels.min() and pixels.max() <= 1.0


# Bad dataset inputs (missing/empty folder, unreadable image, small image, captions): test_bad_inputs.py
