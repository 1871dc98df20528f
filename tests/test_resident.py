"""Device-resident data (`data.on_device=true`, accel.resident): the same images and labels as
the DataLoader path, torchvision's crop-with-padding and flip, deterministic under the seed, and
resumable mid-pass. Run on CPU; on a GPU the same code runs with `device=cuda`."""

from __future__ import annotations

import re
from collections import Counter

import pytest
import torch
from torchvision.transforms.v2 import functional as TF

from accel import config
from accel.data import build_data
from accel.resident import ResidentLoader, crop_flip
from accel.train.loader import Batches
from tests.conftest import make_imagefolder

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """16 px RGB PNGs, 3 classes x 12 train, 2 test each."""
    return make_imagefolder(tmp_path_factory.mktemp("resident"), side=16, classes=3,
                            per_class={"train": 12, "test": 2})


def image_cfg(folder, *more: str):
    return config.load(None, ["data.dataset=imagefolder", f"data.root={folder}",
                              "data.val_fraction=0.25", "train.batch_size=9",
                              "train.device=cpu", *more])


def as_uint8(x: torch.Tensor, mean, std) -> torch.Tensor:
    """Undo the normalisation: the pixels the batch was made of."""
    m, s = torch.tensor(mean).view(1, -1, 1, 1), torch.tensor(std).view(1, -1, 1, 1)
    return (x * s * 255 + m * 255).round().to(torch.uint8)


def one_pass(loader) -> Counter:
    """(pixels, label) of every image one pass over `loader` hands out, as a multiset."""
    from accel.data import IMAGENET_MEAN, IMAGENET_STD

    out = Counter()
    for x, y in loader:
        for img, label in zip(as_uint8(x, IMAGENET_MEAN, IMAGENET_STD), y, strict=True):
            out[(img.numpy().tobytes(), int(label))] += 1
    return out


def every_sample(ds) -> Counter:
    """(pixels, label) of every sample of a split, one by one: no batches, nothing dropped."""
    return one_pass((x[None], torch.tensor([y])) for x, y in ds)


@pytest.mark.parametrize("split", ["train", "val", "test"])
def test_a_pass_holds_the_same_images_and_labels_as_the_dataloader(folder, split):
    """Against the DataLoader that decodes the files. 27 training images in batches of 8: a pass
    drops 3 (drop_last), each way its own 3, so a training pass holds 24 of the split's images,
    each once; val and test passes hold the whole split."""
    files = build_data(image_cfg(folder, "data.augment=false", "train.batch_size=8"), CPU)
    resident = build_data(image_cfg(folder, "data.augment=false", "data.on_device=true",
                                    "train.batch_size=8"), CPU)
    assert isinstance(getattr(resident, split), ResidentLoader)
    whole = every_sample(getattr(files, split).dataset)
    want, got = one_pass(getattr(files, split)), one_pass(getattr(resident, split))
    assert sum(whole.values()) == {"train": 27, "val": 9, "test": 6}[split]  # 25% held out
    assert len(whole) == sum(whole.values())  # random pixels: every image differs
    if split == "train":
        assert sum(got.values()) == sum(want.values()) == 24
        assert got <= whole and want <= whole  # each image at most once, none from elsewhere
    else:
        assert got == want == whole


def test_training_batches_are_shuffled_and_seeded(folder):
    def labels(*more):
        data = build_data(image_cfg(folder, "data.on_device=true", *more), CPU)
        return [y.tolist() for _, y in data.train], [x for x, _ in data.train]

    (a, xa), (b, xb) = labels(), labels()
    (c, _) = labels("train.seed=1")
    assert a == b and all(torch.equal(u, v) for u, v in zip(xa, xb, strict=True))
    assert a != c
    order = torch.cat([torch.tensor(batch) for batch in a])
    assert order.tolist() != sorted(order.tolist())


def candidates(src: torch.Tensor, pad: int) -> dict[bytes, tuple[int, int, bool]]:
    """Every output torchvision's RandomCrop(padding=pad) + RandomHorizontalFlip can give."""
    h, w = src.shape[-2:]
    padded = TF.pad(src, [pad])  # zero fill, as RandomCrop's default
    out = {}
    for top in range(2 * pad + 1):
        for left in range(2 * pad + 1):
            crop = TF.crop(padded, top, left, h, w)
            out[crop.numpy().tobytes()] = (top, left, False)
            out[TF.horizontal_flip(crop).numpy().tobytes()] = (top, left, True)
    return out


def test_augmentation_is_a_padded_crop_then_a_flip_with_every_offset_drawn():
    pad, n = 2, 400
    images = torch.randint(0, 256, (n, 3, 8, 8), dtype=torch.uint8)
    loader = ResidentLoader(images, torch.arange(n), dataset=None, batch_size=64, device=CPU,
                            mean=(0.0,) * 3, std=(1 / 255,) * 3, pad=pad, shuffle=True,
                            generator=torch.Generator().manual_seed(0))
    seen = set()
    for x, y in loader:
        for img, i in zip(x.round().to(torch.uint8), y, strict=True):
            options = candidates(images[i], pad)
            assert img.numpy().tobytes() in options, f"image {int(i)}: not a crop/flip of it"
            seen.add(options[img.numpy().tobytes()])
    assert len(seen) >= 45  # of the 5 x 5 x 2 = 50 (offset, flip) draws, over 400 images


def test_two_ranks_batches_together_are_one_process_batches_at_twice_the_size():
    """Each rank's share of an update, augmentation included, joined rank by rank, is the batch
    one process at 2b draws from the same seed; a pass drops the same images both ways."""
    n, b = 70, 8
    images = torch.randint(0, 256, (n, 3, 8, 8), dtype=torch.uint8)

    def batches(size, rank=0, world=1):
        loader = ResidentLoader(images, torch.arange(n), dataset=None, batch_size=size,
                                device=CPU, mean=(0.5,) * 3, std=(0.25,) * 3, pad=2,
                                shuffle=True, drop_last=True, rank=rank, world=world,
                                generator=torch.Generator().manual_seed(3))
        return list(loader)

    one, ranks = batches(2 * b), [batches(b, r, 2) for r in range(2)]
    assert len(one) == len(ranks[0]) == len(ranks[1]) == n // (2 * b)
    for whole, *shares in zip(one, *ranks, strict=True):
        xs, ys = zip(*shares, strict=True)
        assert all(len(y) == b for y in ys)
        order = torch.stack(ys, 1).flatten()  # positions r, r + 2, ... were rank r's
        assert torch.equal(order, whole[1])
        assert torch.equal(torch.stack(xs, 1).flatten(0, 1), whole[0])
    assert set(torch.cat([y for _, y in ranks[0]]).tolist()).isdisjoint(
        torch.cat([y for _, y in ranks[1]]).tolist())


@pytest.mark.parametrize("on_device", [False, True], ids=["loader", "resident"])
@pytest.mark.parametrize("split", ["val", "test"])
def test_two_ranks_score_every_evaluation_image_once(folder, split, on_device, monkeypatch):
    """9 val and 6 test images on 2 ranks: rank 0 gets 5 and 3, rank 1 gets 4 and 3; together
    the whole split, none twice (Ignite's metrics add the ranks' counts up)."""
    from accel import ranks

    monkeypatch.setattr(ranks, "world_size", lambda: 2)
    shares = []
    for r in (0, 1):
        monkeypatch.setattr(ranks, "rank", lambda r=r: r)
        data = build_data(image_cfg(folder, "data.augment=false", "train.batch_size=4",
                                    f"data.on_device={on_device}"), CPU)
        shares.append(one_pass(getattr(data, split)))
    whole = every_sample(getattr(data, split).dataset)
    assert [sum(s.values()) for s in shares] == {"val": [5, 4], "test": [3, 3]}[split]
    assert shares[0] + shares[1] == whole and not shares[0] & shares[1]


def test_crop_flip_zero_offsets_no_flip_is_the_padded_corner():
    x = torch.arange(2 * 1 * 3 * 3, dtype=torch.uint8).view(2, 1, 3, 3)
    out = crop_flip(x, 1, torch.tensor([[1, 1], [0, 2]]), torch.tensor([False, True]))
    assert torch.equal(out[0], x[0])  # the centre crop of the padded image is the image
    # top=0, left=2: one row of zeros on top, the columns shifted left by one, then mirrored
    shifted = torch.nn.functional.pad(x[1], (1, 1, 1, 1))[:, 0:3, 2:5]
    assert torch.equal(out[1], shifted.flip(-1))


def test_reflect_padding_mirrors_the_image_at_its_edges():
    """data.padding=reflect: the top-left crop of a 3x3 image padded by 1 starts one row and
    one column outside it, mirrored about the edge pixels (no zeros)."""
    x = torch.arange(9, dtype=torch.uint8).view(1, 1, 3, 3)  # rows 0 1 2 / 3 4 5 / 6 7 8
    out = crop_flip(x, 1, torch.tensor([[0, 0]]), torch.tensor([False]), "reflect")
    assert out[0, 0].tolist() == [[4, 3, 4], [1, 0, 1], [4, 3, 4]]
    zeros = crop_flip(x, 1, torch.tensor([[0, 0]]), torch.tensor([False]))
    assert zeros[0, 0].tolist() == [[0, 0, 0], [0, 0, 1], [0, 3, 4]]


@pytest.mark.parametrize("on_device", [True, False])
def test_a_grey_image_padded_by_reflection_never_shows_a_black_border(tmp_path, on_device):
    """Both training paths take data.padding: images of one grey level, cropped from a 4 px
    padding, hold only that grey with reflect and black pixels with zeros."""
    from PIL import Image

    from accel.data import IMAGENET_MEAN, IMAGENET_STD

    root = tmp_path / "grey"
    for split in ("train", "test"):
        for c in ("a", "b"):
            (root / split / c).mkdir(parents=True)
            for i in range(4):
                Image.new("RGB", (16, 16), (128, 128, 128)).save(root / split / c / f"{i}.png")
    seen = {}
    for padding in ("zeros", "reflect"):
        cfg = image_cfg(root, f"data.padding={padding}", "data.translate=4",
                        f"data.on_device={on_device}", "data.in_memory=true")
        data = build_data(cfg, CPU)
        pixels = torch.cat([as_uint8(x, IMAGENET_MEAN, IMAGENET_STD).flatten()
                            for _ in range(3)
                            for x, _ in data.train])
        seen[padding] = set(pixels.unique().tolist())
    assert seen["reflect"] == {128}
    assert 0 in seen["zeros"] and 128 in seen["zeros"]


def test_a_resumed_pass_hands_out_the_same_remaining_batches(folder):
    cfg = image_cfg(folder, "data.on_device=true", "train.batch_size=4")

    def fresh():
        return Batches(build_data(cfg, CPU).train)

    whole = list(fresh())
    first = fresh()
    it = iter(first)
    for _ in range(3):
        next(it)
    state = first.state_dict()
    resumed = fresh()
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert len(rest) == len(whole) - 3
    for (xa, ya), (xb, yb) in zip(whole[3:], rest, strict=True):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_digits_on_device_trains():
    from accel.train import train

    cfg = config.load(None, ["data.dataset=digits", "model.name=accel_cnn_s", "train.epochs=2",
                             "train.batch_size=64", "train.device=cpu", "data.on_device=true"])
    result = train(cfg, track=False)
    assert len(result.history) == 2
    assert result.history[-1]["val_accuracy"] > 0.8  # 10 classes; the DataLoader path: ~0.95


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_the_batches_are_made_there_and_equal_the_cpu_ones(folder):
    cuda = torch.device("cuda")
    on_gpu = build_data(image_cfg(folder, "data.on_device=true", "train.device=cuda"), cuda)
    on_cpu = build_data(image_cfg(folder, "data.on_device=true"), CPU)
    assert on_gpu.train.images.device.type == "cuda"
    for (xg, yg), (xc, yc) in zip(on_gpu.train, on_cpu.train, strict=True):
        assert xg.device.type == "cuda" and yg.device.type == "cuda"
        assert torch.equal(xg.cpu(), xc) and torch.equal(yg.cpu(), yc)  # gather + exact ops


def test_alternating_flips_mirror_each_image_in_every_other_pass():
    """data.flip=alternating: one random choice per image, reversed pass by pass; random flips
    are drawn afresh. The crops stay random either way."""
    n = 400
    images = torch.zeros(n, 3, 8, 8, dtype=torch.uint8)

    def flips(kind: str) -> list[torch.Tensor]:
        loader = ResidentLoader(images, torch.arange(n), dataset=None, batch_size=50, device=CPU,
                                pad=2, shuffle=True, generator=torch.Generator().manual_seed(0),
                                flip=kind)
        return [loader.draws()[2] for _ in range(3)]

    a, b, c = flips("alternating")
    assert torch.equal(b, ~a) and torch.equal(c, a)
    assert 0.4 < a.float().mean() < 0.6
    r1, r2, _ = flips("random")
    assert not torch.equal(r2, ~r1) and not torch.equal(r2, r1)


def test_a_run_resumed_in_its_second_pass_gets_the_same_alternating_flips(folder):
    """The pass count is in the checkpoint: stopped inside the second pass (odd: every image
    mirrored the other way), the resumed loader hands out the same batches."""
    cfg = image_cfg(folder, "data.on_device=true", "data.flip=alternating", "data.translate=1",
                    "train.batch_size=4")

    def fresh():
        return Batches(build_data(cfg, CPU).train)

    whole = fresh()
    assert whole.loader.pad == 1  # data.translate
    passes = [list(whole), list(whole)]
    first = fresh()
    list(first)  # the first pass
    it = iter(first)
    for _ in range(2):
        next(it)
    resumed = fresh()
    resumed.load_state_dict(first.state_dict())
    rest = list(resumed)
    assert len(rest) == len(passes[1]) - 2
    for (xa, ya), (xb, yb) in zip(passes[1][2:], rest, strict=True):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    after = fresh()  # stopped at the end of the first pass: the next one is the second
    list(after)
    state = after.state_dict()
    again = fresh()
    again.load_state_dict(state)
    assert all(torch.equal(xa, xb) for (xa, _), (xb, _) in zip(passes[1], list(again),
                                                                strict=True))


def test_alternating_flips_need_resident_data():
    with pytest.raises(config.ConfigError, match="data.flip=alternating .* data.on_device=true"):
        config.load(None, ["data.flip=alternating"])


def test_the_split_is_resized_a_chunk_at_a_time_to_the_same_bits(monkeypatch):
    """A resident split resized to the model's size goes through the resize a chunk at a time
    (its fp32 work then holds one chunk, not the split) and gives the whole-split resize's
    result bit for bit."""
    from torchvision.transforms.v2 import functional as TF

    from accel import resident

    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (10, 3, 12, 12), dtype=torch.uint8, generator=g)
    whole = TF.resize(images, [20, 20], antialias=True)
    seen = []
    original = TF.resize

    def resize(x, *args, **kwargs):
        seen.append(len(x))
        return original(x, *args, **kwargs)

    monkeypatch.setattr(TF, "resize", resize)
    chunked = resident.resize_split(images, 20, chunk=4)
    assert seen == [4, 4, 2]
    assert chunked.dtype == torch.uint8 and torch.equal(chunked, whole)


def jittered(jitter: float, pad: int = 2) -> ResidentLoader:
    n = 96
    images = torch.randint(0, 256, (n, 3, 8, 8), generator=torch.Generator().manual_seed(1),
                           dtype=torch.uint8)
    return ResidentLoader(images, torch.arange(n), dataset=None, batch_size=32, device=CPU,
                          mean=(0.5,) * 3, std=(0.25,) * 3, pad=pad, shuffle=True,
                          generator=torch.Generator().manual_seed(7), jitter=jitter)


@pytest.mark.parametrize("pad", [2, 0], ids=["augmented", "no-crop"])
def test_color_jitter_shifts_then_scales_each_image_by_its_own_draw(pad):
    """data.color_jitter (hiverge): image i of a pass is (x_i + b_i) * c_i, x_i its batch
    without the jitter, b_i in [-j, j] and c_i in [1 - j, 1 + j] drawn for that image; the
    order, crops and flips are the ones the loader draws without it (drawn first)."""
    j = 0.15
    plain, tones = list(jittered(0.0, pad)), jittered(j, pad).draws()[3]
    assert tones.shape == (96, 2)
    assert tones[:, 0].abs().max() <= j and (tones[:, 1] - 1).abs().max() <= j
    assert tones[:, 0].std() > j / 4 and tones[:, 1].std() > j / 4  # drawn, not constant
    for (x, y), (want, y_plain) in zip(jittered(j, pad), plain, strict=True):
        assert torch.equal(y, y_plain)
        b, c = tones[y, 0].view(-1, 1, 1, 1), tones[y, 1].view(-1, 1, 1, 1)
        torch.testing.assert_close(x, (want + b) * c)
        assert not torch.allclose(x, want)


def test_color_jitter_draws_anew_each_pass_and_only_for_training(folder):
    loader = jittered(0.15)
    first, second = loader.draws()[3], loader.draws()[3]
    assert not torch.allclose(first, second)
    data = build_data(image_cfg(folder, "data.on_device=true", "data.color_jitter=0.15"), CPU)
    assert data.train.jitter == 0.15 and data.val.jitter == 0 and data.test.jitter == 0


@pytest.mark.parametrize("more, says", [
    (["data.color_jitter=1.5", "data.on_device=true"], "data.color_jitter=1.5: must be in [0, 1)"),
    (["data.color_jitter=0.1"], "data.color_jitter=0.1 is drawn by the resident loader"),
])
def test_color_jitter_outside_its_range_or_off_the_device_is_refused(folder, more, says):
    from accel.errors import ConfigError

    with pytest.raises(ConfigError, match=re.escape(says)):
        image_cfg(folder, *more)
