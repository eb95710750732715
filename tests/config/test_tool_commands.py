"""The tools' command lines (benches, demo, doctor, prepare, check-videos) are generated from the
configuration tree (:mod:`tsm_ds.config.tools`): shared options are the training fields, the
defaults written out in the bottom layer equal the library's, every run the product starts itself
is written by ``to_argv`` and read back by the parser it is meant for."""
from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from tsm_ds.config import Config, field_infos, parse, to_argv, tools
from tsm_ds.config.commands import TRAIN
from tsm_ds.config.env import VARIABLES

REPO = Path(__file__).resolve().parents[2]
#: the command modules of the tools, each with ``COMMAND`` and ``build_parser()``
TOOL_MODULES = {"bench models": "bench_models", "bench data": "bench_data", "bench comm": "bench_comm",
                "bench scale": "bench_scale", "bench large-batch": "bench_large_batch",
                "bench multigrid": "bench_multigrid", "demo": "demo",
                "doctor": "doctor", "prepare": "prepare", "check-videos": "check_videos"}


def test_no_option_is_declared_by_hand():
    """Every option of the tools' commands comes from a field: no add_argument in their modules."""
    files = [REPO / "tsm_ds" / "cli" / f"{m}.py" for m in [*TOOL_MODULES.values(), "bench", "_doctor_cluster"]]
    for f in files:
        calls = [n for n in ast.walk(ast.parse(f.read_text())) if isinstance(n, ast.Attribute)
                 and n.attr in ("add_argument", "add_argument_group", "add_mutually_exclusive_group")]
        assert not calls, f"{f.name}: {len(calls)} hand-written option(s)"


@pytest.mark.parametrize("name", sorted(TOOL_MODULES))
def test_each_parser_is_its_command(name):
    import importlib

    module = importlib.import_module(f"tsm_ds.cli.{TOOL_MODULES[name]}")
    assert module.COMMAND is tools.TOOL_COMMANDS[name]
    parser = module.build_parser()
    assert parser.prog == f"tsm-ds {name}"
    infos = field_infos(Config)
    dests = {a.dest for a in parser._actions} - {"help"}
    assert dests == {infos[p].dest for p in module.COMMAND.paths(infos)}


def test_shared_options_are_the_training_fields():
    infos = field_infos(Config)
    shared = {"--arch": "model.arch", "--num-segments": "model.num_segments", "--img-size": "data.img_size",
              "--deepspeed_config": "engine.deepspeed_config", "--data": "data.data",
              "--num-classes": "model.num_classes", "--seed": "schedule.seed", "--epochs": "schedule.epochs",
              "--batch-size": "schedule.batch_size", "--lr": "schedule.lr", "--warmup-steps": "schedule.warmup_steps",
              "--dropout": "model.dropout", "--shift-div": "model.shift_div", "--num-workers": "data.num_workers",
              "--channels-last": "model.channels_last", "--compile": "model.compile",
              "--local_rank": "distributed.local_rank", "--no-progress": "logging.progress",
              "--micro-batch-size": "schedule.micro_batch_size"}
    tool_sections = {f.name for f in dataclasses.fields(Config)
                     if f.default_factory.__module__ == tools.__name__}   # type: ignore[union-attr]
    for name, cmd in tools.TOOL_COMMANDS.items():
        for path in cmd.paths(infos):
            flag = infos[path].flag
            if flag in shared:
                assert path == shared[flag], f"{name}: {flag} is {path}, not the shared {shared[flag]}"
            if infos[path].section in tool_sections:
                assert flag not in shared, f"{name}: {flag} declared again in {path}"


def test_defaults_written_in_the_bottom_layer_equal_the_library():
    from tsm_ds.bench import comm, data, runner
    from tsm_ds.bench.scaling.presets import CLUSTERS, PAPER
    from tsm_ds.experiments.demo import DEFAULT_RECIPE
    from tsm_ds.experiments.large_batch.grid import QUICK, RECIPES, StudySettings

    assert tools.BENCH_DATA_LOADERS == data.LOADERS and tools.COMM_METHODS == comm.METHODS
    assert tools.BenchCommConfig().numel == comm.TSM_R50_NUMEL
    assert tools.BENCH_ALL_ORDER == runner.ALL_ORDER and tools.BenchAllConfig().out_dir == runner.DEFAULT_OUT
    assert tools.SCALE_CLUSTERS == tuple(sorted(CLUSTERS))
    s = tools.BenchScaleConfig()
    assert (s.gpus, s.calib_gpus, s.calib_time_s, s.dataset_size, s.batch_per_gpu) == (
        PAPER["large_scale_gpus"], PAPER["single_node_gpus"], PAPER["single_node_time_s"], PAPER["dataset_size"],
        PAPER["batch_per_gpu"])
    assert tools.BENCH_SCALE.defaults["schedule.epochs"] == PAPER["epochs"]
    assert tools.LARGE_BATCH_RECIPES == tuple(RECIPES)
    assert tools.DEMO_RECIPE == DEFAULT_RECIPE
    # the help of every study value left unset names the full study's default (--quick's micro-batch too)
    full, helps = StudySettings(), {f.name: f.metadata["help"] for f in dataclasses.fields(tools.BenchLargeBatchConfig)}
    for name in ("batches", "min_steps", "train_per_class", "sgd_lrs", "lars_lrs", "lamb_lrs", "seeds",
                 "warmup_epochs", "max_micro_batch", "parallel", "threads", "headroom"):
        value = getattr(full, name)
        shown = ",".join(f"{v:g}" for v in value) if isinstance(value, tuple) else f"{value:g}"
        assert f"(default {shown})" in helps[name], name
    assert f"(default {full.micro_batch}; --quick: {QUICK.micro_batch})" in tools.BENCH_LARGE_BATCH.epilog
    from tsm_ds.data.synthetic import DIFFICULTIES
    from tsm_ds.experiments.large_batch.grid import estimate_text

    assert tools.LARGE_BATCH_DIFFICULTIES == tuple(DIFFICULTIES)
    assert estimate_text(full) in tools.LARGE_BATCH_ESTIMATE in tools.BENCH_LARGE_BATCH.epilog   # the library's


def test_tool_variables_are_in_the_one_table():
    infos = field_infos(Config)
    for name, cmd in tools.TOOL_COMMANDS.items():
        for path in cmd.paths(infos):
            var = infos[path].meta.get("env")
            if var:
                assert VARIABLES[var][0] == path and cmd.use_env, (name, path)


def test_doctor_cluster_options_default_to_the_environment():
    from tsm_ds.cli.doctor import COMMAND, doctor_settings

    env = {"SSH_PORT": "2222", "MASTER_ADDR": "node0", "MASTER_PORT": "29600", "TSM_DS_DATA": "/clips"}
    cfg, _ = parse(COMMAND, Config, ["--hostfile", "h"], env=env)
    assert (cfg.cluster.ssh_port, cfg.cluster.master_addr, cfg.cluster.master_port) == (2222, "node0", 29600)
    s = doctor_settings(cfg)
    assert s.only == ("cluster",) and s.extra["master_port"] == 29600 and s.extra["timeout"] == 60.0
    assert s.data == "/clips"
    cfg, _ = parse(COMMAND, Config, ["--master-port", "1234", "--cluster-timeout", "5"], env=env)
    assert cfg.cluster.master_port == 1234 and cfg.cluster.timeout == 5.0      # the flag wins
    assert doctor_settings(cfg).extra == {}                                  # no --hostfile: no cluster section
    cfg, _ = parse(COMMAND, Config, [], env={})
    assert cfg.cluster.ssh_port is None and cfg.data.data is None


def test_doctor_settings_of_the_command_line():
    from tsm_ds.cli.doctor import COMMAND, doctor_settings

    cfg, _ = parse(COMMAND, Config, [], env={})
    s = doctor_settings(cfg)
    # unset: this device's defaults (DoctorSettings.resolved), as before
    assert (s.arch, s.num_segments, s.img_size, s.micro_batch, s.recipe) == (None, None, None, None, None)
    assert (s.num_classes, s.short_side, s.keyint, s.comm_methods, s.only) == (400, 256, 16, ("fp32", "bf16", "onebit"),
                                                                              None)
    cfg, _ = parse(COMMAND, Config, ["--deepspeed_config", "cpu_bf16", "--micro-batch", "3", "--workers", "1,2",
                                     "--only", "compute,data", "--no-progress", "--channels-last"], env={})
    s = doctor_settings(cfg)
    assert (s.recipe, s.micro_batch, s.workers, s.only, s.channels_last) == (
        "cpu_bf16", 3, (1, 2), ("compute", "data"), True)
    assert cfg.logging.progress is False
    with pytest.raises(SystemExit):                 # --recipe is gone: --deepspeed_config
        parse(COMMAND, Config, ["--recipe", "cpu_fp32"], env={})


def test_doctor_hint_is_a_doctor_command_line():
    from tsm_ds.doctor import DoctorSettings
    from tsm_ds.doctor.comm import launcher_hint
    from tsm_ds.doctor.core import Context

    hint = launcher_hint(Context(settings=DoctorSettings(quick=True, arch="mobilenet_v2").resolved(False)))
    head = "deepspeed --num_gpus 2 --module tsm_ds.cli.doctor "
    assert hint.startswith(head)
    cfg, _ = parse(tools.DOCTOR, Config, hint[len(head):].split(), env={})
    assert (cfg.model.arch, cfg.engine.deepspeed_config, cfg.data.img_size, cfg.doctor.quick) == (
        "mobilenet_v2", "cpu_fp32", 64, True)
    assert cfg.doctor.only == ("compute", "communication", "verdict")


def test_bench_comm_worker_argv_round_trips():
    from tsm_ds.bench.comm import worker_argv

    argv = worker_argv("/out", methods=["fp32", "onebit"], reps=3, warmup=1, flat=True, numel=10, chunk_size=8)
    b = parse(tools.BENCH_COMM, Config, argv)[0].bench_comm
    assert (b.worker, b.out_dir, b.methods, b.reps, b.warmup, b.flat, b.numel, b.chunk_size) == (
        True, "/out", ("fp32", "onebit"), 3, 1, True, 10, 8)


def test_large_batch_runs_are_training_command_lines(tmp_path):
    from tsm_ds.engine.guards.divergence import EXIT_DIVERGED
    from tsm_ds.experiments.large_batch.grid import QUICK, RunSpec
    from tsm_ds.experiments.large_batch.runs import TRAIN_MODULE, train_command

    assert EXIT_DIVERGED == 3
    spec = RunSpec("lars_b8_s1", "lars", str(tmp_path / "lars.json"), 8, 1, 0.5, "sweeps")
    data = {"train_list": "/d/train.txt", "val_list": "/d/val.txt", "root": "/d"}
    cmd = train_command(spec, QUICK, data, tmp_path / "runs")
    assert cmd[1:3] == ["-m", TRAIN_MODULE]
    cfg, _ = parse(TRAIN, Config, cmd[3:])
    assert cfg.engine.deepspeed_config == spec.recipe_file and cfg.data.flip is False
    assert (cfg.schedule.batch_size, cfg.schedule.micro_batch_size, cfg.schedule.seed) == (8, QUICK.max_micro_batch, 1)
    assert cfg.model.ghost_bn_clips == QUICK.ghost_bn_clips and cfg.schedule.warmup_epochs == QUICK.warmup_epochs
    assert (cfg.model.arch, cfg.model.num_segments, cfg.data.img_size) == (QUICK.arch, QUICK.num_segments,
                                                                           QUICK.img_size)
    assert cfg.data.cache_decoded is QUICK.cache_decoded and cfg.output.keep_last == 1
    assert (cfg.output.run_name, cfg.logging.progress) == ("lars_b8_s1", False)
    off = train_command(spec, dataclasses.replace(QUICK, cache_decoded=False), data, tmp_path / "runs")
    assert "--cache-decoded" not in off and parse(TRAIN, Config, off[3:])[0].data.cache_decoded is False


def test_bench_all_refuses_quick_with_full(capsys):
    from tsm_ds.cli import bench

    with pytest.raises(SystemExit) as e:
        bench.main(["all", "--quick", "--full", "--only", "scale"])
    assert e.value.code == 2 and "not allowed with argument --quick" in capsys.readouterr().err
    assert bench.main(["all", "--only", "nope"]) == 2


def test_bench_options_still_introspect_the_generated_parsers():
    from tsm_ds.cli import bench

    assert {"--out-dir", "--out", "--quick", "--frames", "--img-size"} <= bench.bench_options("tsm_ds.cli.bench_models")
    assert bench.bench_argv("models", "R", quick=True) == ["--out-dir", "R", "--quick"]
    assert bench.bench_argv("comm", "R", quick=False) == ["--out-dir", "R"]


def test_to_argv_round_trips_every_tool_command():
    """A tree changed in every field a command uses comes back the same through its parser."""
    infos = field_infos(Config)
    samples = {int: 7, float: 0.25, str: "x"}
    for name, cmd in tools.TOOL_COMMANDS.items():
        values = {}
        for path in cmd.paths(infos):
            info = infos[path]
            if info.meta.get("hidden") or info.meta.get("env"):
                continue
            if info.meta.get("choices"):
                values[path] = info.meta["choices"][-1]
                continue
            import typing

            from tsm_ds.config.env import unwrap_optional as _unwrap

            tp, _ = _unwrap(info.type)
            if tp is bool:
                values[path] = not cmd.defaults.get(path, info.default)
            elif typing.get_origin(tp) in (list, tuple):
                elem = typing.get_args(tp)[0]
                n = info.meta.get("nargs") if isinstance(info.meta.get("nargs"), int) else 2
                values[path] = tuple([samples[elem]] * n)
            else:
                values[path] = samples[tp]
        cfg, _ = parse(cmd, Config, to_argv(cmd, Config, values, only_changed=False), env={})
        for path, value in values.items():
            got = getattr(getattr(cfg, infos[path].section), infos[path].name)
            assert (tuple(got) if isinstance(got, list) else got) == value, (name, path)
