"""The multigrid shape schedule (exact stage tables, step lookup) and its batch sampler (every sample
once per epoch at world 1, 2, 4, DistributedSampler's order, the schedule's shapes, resume)."""
from __future__ import annotations

import pytest
from torch.utils.data import DataLoader, DistributedSampler

from tsm_ds.data import VideoClipDataset, normalize_batch
from tsm_ds.data.packed_batch import collate_items
from tsm_ds.data.records import VideoRecord
from tsm_ds.data.testvideo import number_frame
from tsm_ds.data.video import packed as P
from tsm_ds.engine.loop.multigrid import StepShape, build_schedule
from tsm_ds.engine.loop.multigrid_sampler import MultigridBatchSampler
from tsm_ds.models import build_model

KINETICS = dict(frames=8, crop=224, global_batch=64, epochs=50, lr_steps=[20, 40])


def rows(sched):
    return [(s.epoch_start, s.epoch_end, s.lr_stage, s.long_cycle,
             [(x.frames, x.crop, x.batch_factor) for x in s.shapes], round(s.lr_factor, 9)) for s in sched.stages]


def test_long_cycle_kinetics_table():
    # PySlowFast's allotment by hand: per lr stage of 20 epochs, shape j gets 20 b_j / 15 epochs (b = 8, 4, 2, 1);
    # 10.67 steps-equivalent per stage, saving 3.75x; final 10 / 3.75 = 2.67 epochs; all x 75 / 42.67
    s = build_schedule(**KINETICS, mode="long")
    assert s.epochs == 75
    assert rows(s) == [
        (0, 19, 0, 0, [(2, 160, 8)], 8.0), (19, 28, 0, 1, [(4, 160, 4)], 4.0), (28, 33, 0, 2, [(4, 224, 2)], 2.0),
        (33, 35, 0, 3, [(8, 224, 1)], 1.0), (35, 54, 1, 0, [(2, 160, 8)], 0.8), (54, 63, 1, 1, [(4, 160, 4)], 0.4),
        (63, 68, 1, 2, [(4, 224, 2)], 0.2), (68, 70, 1, 3, [(8, 224, 1)], 0.1),
        (70, 72, 1, None, [(8, 224, 1)], 0.1), (72, 75, 2, None, [(8, 224, 1)], 0.01)]
    assert s.stages[0].shapes[0] == StepShape(2, 160, 8, 512)
    # clips x frames x pixels per step within 4 % of the base (rounding of 224 / sqrt 2 to 160)
    base = 64 * 8 * 224 * 224
    assert all(abs(sh.cost / base - 1) < 0.04 for st in s.stages for sh in st.shapes)


def test_long_and_short_cycle_table_and_pyslowfast_rounding():
    s = build_schedule(**KINETICS, mode="long+short")
    assert rows(s)[:4] == [
        (0, 16, 0, 0, [(2, 112, 16), (2, 160, 8), (2, 160, 8)], 8.0),
        (16, 24, 0, 1, [(4, 112, 8), (4, 160, 4), (4, 160, 4)], 4.0),
        (24, 31, 0, 2, [(4, 112, 8), (4, 160, 4), (4, 224, 2)], 2.0),
        (31, 34, 0, 3, [(8, 112, 4), (8, 160, 2), (8, 224, 1)], 1.0)]
    assert [(r[0], r[1], r[5]) for r in rows(s)[-2:]] == [(68, 71, 0.1), (71, 75, 0.01)]
    # crop_multiple=1 is PySlowFast's rounding to the pixel: 224 / sqrt 2 -> 158
    px = build_schedule(**KINETICS, mode="long", crop_multiple=1)
    assert [st.shapes[0].crop for st in px.stages[:4]] == [158, 158, 224, 224]


def test_short_only_none_final_stage_off_and_min_frames():
    s = build_schedule(**KINETICS, mode="short")
    assert rows(s) == [(0, 30, 0, None, [(8, 112, 4), (8, 160, 2), (8, 224, 1)], 1.0),
                       (30, 60, 1, None, [(8, 112, 4), (8, 160, 2), (8, 224, 1)], 0.1),
                       (60, 75, 2, None, [(8, 112, 4), (8, 160, 2), (8, 224, 1)], 0.01)]
    n = build_schedule(**KINETICS, mode="none")
    assert rows(n) == [(0, 20, 0, None, [(8, 224, 1)], 1.0), (20, 40, 1, None, [(8, 224, 1)], 0.1),
                       (40, 50, 2, None, [(8, 224, 1)], 0.01)]
    off = build_schedule(**KINETICS, mode="long", final_stage=False, epoch_factor=1.0)
    assert [r[2] for r in rows(off)] == [0] * 4 + [1] * 4 + [2] * 4 and off.epochs == 50
    # T=4: 4 x 1/4 = 1 frame is raised to the floor of 2 (the first two shapes coincide), and the batch
    # factor follows the rounded shape: round(4 x 112^2 / (2 x 80^2)) = round(3.92) = 4
    t4 = build_schedule(frames=4, crop=112, global_batch=8, epochs=10, lr_steps=[5], mode="long")
    assert [(x.frames, x.crop, x.batch_factor) for st in t4.stages[:4] for x in st.shapes] == \
        [(2, 80, 4), (2, 80, 4), (2, 112, 2), (4, 112, 1)]
    even = build_schedule(frames=6, crop=112, global_batch=8, epochs=10, lr_steps=[5], mode="long", even_frames=True)
    assert [st.shapes[0].frames for st in even.stages[:4]] == [2, 4, 4, 6]


def test_bad_values_name_their_flag():
    with pytest.raises(ValueError, match="--multigrid: 'longer'"):
        build_schedule(**KINETICS, mode="longer")
    with pytest.raises(ValueError, match="--multigrid-min-frames"):
        build_schedule(**KINETICS, min_frames=0)
    with pytest.raises(ValueError, match="--multigrid-final-stage"):
        build_schedule(frames=8, crop=224, global_batch=8, epochs=6, lr_steps=[20, 40], mode="long")
    with pytest.raises(ValueError, match="--multigrid-epoch-factor"):
        build_schedule(**KINETICS, epoch_factor=0)


def test_step_lookup_total_steps_and_micro_batches():
    s = build_schedule(frames=8, crop=112, global_batch=8, epochs=6, lr_steps=[3], mode="long+short",
                       epoch_factor=1.0)
    clips = 200   # e.g. 200 clips at world 1, or 199 at world 2 padded to 200
    per_epoch = [s.epoch_steps(e, clips) for e in range(s.epochs)]
    assert s.total_steps(clips) == sum(map(len, per_epoch))
    # every step maps back to its epoch, position and shape; the short cycle restarts each epoch
    step = 0
    for e, steps in enumerate(per_epoch):
        before = 0
        for j, sh in enumerate(steps):
            pos = s.locate(step, clips)
            assert (pos.epoch, pos.step_in_epoch, pos.clips_before, pos.shape) == (e, j, before, sh)
            assert pos.shape == s.stages[s.stage_index(e)].shapes[j % len(s.stages[pos.stage].shapes)]
            before += sh.global_batch
            step += 1
        assert before <= clips < before + s.step_shape(e, len(steps)).global_batch
    with pytest.raises(ValueError, match="past the schedule"):
        s.locate(step, clips)
    with pytest.raises(ValueError, match=r"--batch-size 8: stage 0 \(epochs 0-2\) needs 128 clips a step and an "
                                         "epoch has 100"):
        s.total_steps(100)
    # a row per stage and shape: 128 + 64 clips fill 200, the next 64 do not: 2 steps an epoch
    assert s.table(clips)[0] == {"stage": 0, "epochs": "0-2", "lr_stage": 0, "frames": 2, "crop": 56,
                                 "global_batch": 128, "lr_factor": 8.0, "steps_per_epoch": 2}
    first = s.stages[0].shapes[0]
    assert s.micro_batch(first, world=2, accum=2) == first.global_batch // 4
    with pytest.raises(ValueError, match="does not split"):
        s.micro_batch(StepShape(2, 56, 1, 6), world=4, accum=1)


@pytest.mark.parametrize("world", [1, 2, 4])
def test_sampler_sees_every_sample_once_in_distributed_order(world):
    n, accum = 103, 2
    s = build_schedule(frames=8, crop=112, global_batch=8 * world, epochs=4, lr_steps=[2], mode="long+short",
                       epoch_factor=1.0)
    for epoch in range(s.epochs):
        seen, per_rank = [], []
        for rank in range(world):
            smp = MultigridBatchSampler(n, s, num_replicas=world, rank=rank, accum=accum, seed=7, drop_last=False)
            smp.set_epoch(epoch)
            batches = list(smp)
            assert len(batches) == len(smp)
            flat = [i for b in batches for i, _, _ in b]
            ref = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=True, seed=7)
            ref.set_epoch(epoch)
            assert flat == list(ref)                      # the plain sampler's order, cut differently
            seen += flat
            per_rank.append([(len(b), b[0][1], b[0][2]) for b in batches])
        assert sorted(set(seen)) == list(range(n))        # the union is the epoch
        assert len(seen) - n == -n % world                # duplicates: DistributedSampler's padding only
        assert all(p == per_rank[0] for p in per_rank)    # same sizes and shapes on every rank, step by step
        # the shapes: each step's accum micro-batches at the schedule's shape, micro = global / (world x accum)
        steps = s.epoch_steps(epoch, smp.epoch_clips)
        want = [(sh.global_batch // (world * accum), sh.frames, sh.crop) for sh in steps for _ in range(accum)]
        assert per_rank[0][:len(want)] == want
        assert len(per_rank[0]) in (len(want), len(want) + 1)   # + the tail (drop_last=False)


def test_sampler_resumes_on_another_world_size_with_the_same_clips_per_step():
    n = 64
    s = build_schedule(frames=8, crop=112, global_batch=4, epochs=2, lr_steps=[1], mode="short", epoch_factor=1.0)

    def step_sets(world, accum, skip_steps=0, skip_clips=0):
        ranks = []
        for rank in range(world):
            smp = MultigridBatchSampler(n, s, num_replicas=world, rank=rank, accum=accum, seed=1)
            smp.set_epoch(1)
            smp.skip_steps, smp.skip_clips = skip_steps, skip_clips
            ranks.append(list(smp))
        steps = []
        for k in range(len(ranks[0]) // accum):
            mbs = [b for r in ranks for b in r[k * accum:(k + 1) * accum]]
            steps.append((sorted(i for b in mbs for i, _, _ in b), {(t, c) for b in mbs for _, t, c in b}))
        return steps

    full = step_sets(2, 1)                      # world 2: micro = global / 2
    pos = s.locate(len(s.epoch_steps(0, n)) + 2, n)   # a checkpoint after 2 steps of epoch 1
    assert (pos.epoch, pos.step_in_epoch) == (1, 2)
    resumed = step_sets(1, 2, skip_steps=2, skip_clips=pos.clips_before)   # world 1, accumulation 2
    assert resumed == full[2:]
    assert [shapes for _, shapes in full[:4]] == [{(8, 56)}, {(8, 80)}, {(8, 112)}, {(8, 56)}]


def test_a_dataloader_feeds_the_model_the_schedules_shapes(tmp_path, one_thread):
    recs = []
    for v in range(6):
        P.write_packed(tmp_path / f"v{v}.jpack", [number_frame(i, 160, 128, texture=True, seed=v) for i in range(20)])
        recs.append(VideoRecord(str(tmp_path / f"v{v}.jpack"), v % 3))
    ds = VideoClipDataset(recs * 2, mode="train", num_segments=4, img_size=48, seed=0)   # 12 clips
    s = build_schedule(frames=4, crop=48, global_batch=1, epochs=4, lr_steps=[2], mode="long+short", epoch_factor=1.0)
    smp = MultigridBatchSampler(len(ds), s, num_replicas=1, rank=0, seed=0)
    dl = DataLoader(ds, batch_sampler=smp, num_workers=1, collate_fn=collate_items)
    model = build_model("resnet18", 3, num_segments=4).train()
    for epoch in (0, s.epochs - 1):
        smp.set_epoch(epoch)
        ds.set_epoch(epoch)
        got = []
        for b in dl:
            logits = model(normalize_batch(b["clip"], *ds.normalization))
            got.append((tuple(b["clip"].shape), tuple(logits.shape)))
        want = [((sh.global_batch, sh.frames, 3, sh.crop, sh.crop), (sh.global_batch, 3))
                for sh in s.epoch_steps(epoch, len(ds))]
        assert got == want and len(got) >= 2
    assert [g[0][:2] for g in got] == [(4, 4), (2, 4), (1, 4), (4, 4)]   # the short cycle at the base shape: 11 clips
