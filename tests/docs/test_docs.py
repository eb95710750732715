"""The documentation a user reads (README.md and docs/*.md) is tested:

- every ```bash block is announced by ``<!-- run: NAME -->`` (a test below runs it as written, in a
  sandbox whose ``../shared/data`` is the test clips) or ``<!-- check: NAME -->`` (listed in
  ``tests/docs/allowlist.json`` with the reason it is not run);
- in every block, the flags of each ``tsm-ds``, ``python -m tsm_ds...``, ``deepspeed ... tsm_ds/train.py``
  and launch-script command are accepted by that command's parser (the one its ``--help`` prints);
- relative links and their anchors resolve; no issue numbers, commit hashes of this repository or
  change history; README.md is a front page (<= 250 lines) that links the main guides;
- numbers quoted from a command's output or a committed result file are read from them.
"""
from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
ALLOWLIST = Path(__file__).with_name("allowlist.json")
README_MAX_LINES = 250

_FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.S | re.M)
_MARK = re.compile(r"<!-- (run|check): ([\w-]+) -->\n\Z")


@dataclass(frozen=True)
class Block:
    """One fenced code block of a document: its file (relative to the repository), first line,
    language tag, the marker before it (``run`` / ``check`` / None) and its text."""
    file: str
    line: int
    lang: str
    kind: str | None
    name: str | None
    body: str


def doc_files() -> list[Path]:
    """README.md and every docs/*.md."""
    return [REPO / "README.md", *sorted(DOCS.glob("*.md"))]


def blocks_of(path: Path) -> list[Block]:
    """The fenced code blocks of one Markdown file, in order."""
    text = path.read_text(encoding="utf-8")
    out = []
    for m in _FENCE.finditer(text):
        mark = _MARK.search(text[:m.start()])
        out.append(Block(str(path.relative_to(REPO)), text.count("\n", 0, m.start()) + 1, m.group(1).strip(),
                         mark.group(1) if mark else None, mark.group(2) if mark else None, m.group(2)))
    return out


def all_blocks() -> list[Block]:
    """Every fenced block of README.md and docs/*.md."""
    return [b for p in doc_files() for b in blocks_of(p)]


def bash_blocks() -> list[Block]:
    """Every ```bash block of README.md and docs/*.md."""
    return [b for b in all_blocks() if b.lang == "bash"]


def runnable_blocks() -> dict[str, tuple[Path, str]]:
    """NAME -> (document, the bash block's text) of every block announced ``<!-- run: NAME -->``."""
    out: dict[str, tuple[Path, str]] = {}
    for b in bash_blocks():
        if b.kind == "run":
            assert b.name not in out, f"{b.file}: block name {b.name!r} also in {out[b.name][0]}"
            out[b.name] = (REPO / b.file, b.body)
    return out


#: the blocks a test below runs; a new announced block must be added here (and get a test)
RUN_BY_TESTS = {"tour", "check-videos", "models", "plan-1536", "explain-exit", "bench-scale", "shards-s3"}


# ---- every block is run or allowlisted ------------------------------------------------------------

def test_every_bash_block_is_run_or_on_the_allowlist():
    allow = {k: v for k, v in json.loads(ALLOWLIST.read_text()).items() if not k.startswith("_")}
    blocks = bash_blocks()
    unmarked = [f"{b.file}:{b.line}" for b in blocks if b.kind is None]
    assert unmarked == [], "announce each bash block with <!-- run: NAME --> or <!-- check: NAME -->"
    names = [b.name for b in blocks]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    assert {b.name for b in blocks if b.kind == "run"} == RUN_BY_TESTS
    checked = {b.name: b.file for b in blocks if b.kind == "check"}
    assert set(checked) == set(allow), "tests/docs/allowlist.json and the <!-- check: --> blocks differ"
    for name, entry in allow.items():
        assert entry["file"] == checked[name], name
        assert len(entry["reason"]) >= 20, f"{name}: give the reason it is not run"


def test_code_blocks_say_their_language_and_shell_is_bash():
    """An untagged fence or a shell command in a non-bash fence would escape the checks above."""
    shell = re.compile(r"^\s*(tsm-ds|deepspeed|bash launch/|sbatch|python -m tsm_ds)\b", re.M)
    for b in all_blocks():
        assert b.lang, f"{b.file}:{b.line}: a fence without a language (bash, text, python, json)"
        if b.lang != "bash":
            assert not shell.search(b.body), f"{b.file}:{b.line}: shell commands belong in a bash block"
    for p in doc_files():   # no indented (4-space) command lines outside fences
        text = _FENCE.sub("", p.read_text(encoding="utf-8"))
        assert not re.search(r"^ {4}(tsm-ds|deepspeed|bash launch/)", text, re.M), p.name


# ---- flags of every documented command ------------------------------------------------------------

def shell_commands(body: str) -> list[list[str]]:
    """The simple commands of a bash block as token lists: continuation lines joined, comments and
    heredoc bodies dropped, split at ``;``, ``&&``, ``||``, ``|``, ``(``, ``)`` and redirections."""
    kept, heredoc = [], None
    for ln in body.split("\n"):
        if heredoc is not None:
            heredoc = None if ln.strip() == heredoc else heredoc
            continue
        m = re.search(r"<<-?\s*['\"]?(\w+)['\"]?", ln)
        if m:
            heredoc = m.group(1)
        kept.append(ln)
    cmds = []
    for line in "\n".join(kept).replace("\\\n", " ").split("\n"):
        lex = shlex.shlex(line, posix=True, punctuation_chars=";&|()<>")
        lex.whitespace_split = True
        cur: list[str] = []
        for tok in lex:
            if tok and set(tok) <= set(";&|()<>"):
                if cur:
                    cmds.append(cur)
                cur = []
            else:
                cur.append(tok)
        if cur:
            cmds.append(cur)
    return cmds


def _flags(args: list[str]) -> list[str]:
    return [a.split("=", 1)[0] for a in args if re.match(r"^--?[A-Za-z]", a)]


@lru_cache(maxsize=None)
def module_options(module: str) -> frozenset[str] | None:
    """Option strings of a command module's parser (``build_parser()``: what its ``--help`` prints);
    None for a module without one."""
    mod = importlib.import_module(module)
    build = getattr(mod, "build_parser", None)
    if build is None:
        return None
    return frozenset(build()._option_string_actions)


@lru_cache(maxsize=None)
def deepspeed_options() -> frozenset[str]:
    """The ``deepspeed`` launcher's options, from its ``--help``."""
    from deepspeed.launcher import runner

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        with contextlib.suppress(SystemExit):
            runner.parse_args(["--help"])
    return frozenset(re.findall(r"(?<![\w-])--?[A-Za-z][\w-]*", out.getvalue()))


@lru_cache(maxsize=None)
def script_help_options(script: str) -> frozenset[str]:
    """The options a launch script's ``--help`` names (scripts without a parser of their own)."""
    p = subprocess.run(["bash", str(REPO / script), "--help"], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "TSM_DS_VENV": "/nonexistent"})
    assert p.returncode == 0, (script, p.stderr)
    return frozenset(re.findall(r"(?<![\w-])--?[A-Za-z][\w-]*", p.stdout)) | {"--help", "-h"}


def _unknown(what: str, args: list[str], accepted) -> list[str]:
    return [f"{what}: {f} is not an option" for f in _flags(args) if f not in accepted]


def _module_errors(module: str, args: list[str]) -> list[str]:
    module = {"tsm_ds.train": "tsm_ds.cli.train"}.get(module, module)
    try:
        opts = module_options(module)
    except ImportError:
        return [f"python -m {module}: no such module"]
    if opts is None:
        return [f"{module} takes no options: {f}" for f in _flags(args)]
    return _unknown(module, args, opts)


def _script_module(script: str) -> str | None:
    if script in ("tsm_ds/train.py", "tsm_ds.train"):
        return "tsm_ds.cli.train"
    return script if script.startswith("tsm_ds.") else None


def command_flag_errors(cmd: list[str]) -> list[str]:
    """Flags of one simple command that its command does not accept ([] when all are, or when the
    command is none of ``tsm-ds``, ``python -m tsm_ds...``, ``deepspeed``, a ``launch/`` script)."""
    from tsm_ds.cli import COMMANDS
    from tsm_ds.cli.bench import BENCHES
    from tsm_ds.cli.launch_helper import LaunchArgsError, parse_launch_args

    while cmd and re.match(r"^[A-Za-z_]\w*=", cmd[0]):       # NAME=value before the command
        cmd = cmd[1:]
    if not cmd:
        return []
    prog, args = os.path.basename(cmd[0]), cmd[1:]
    if prog == "tsm-ds":
        if not args or args[0] in ("-h", "--help"):
            return []
        if args[0] not in COMMANDS:
            return [f"tsm-ds: unknown command {args[0]}"]
        if args[0] == "bench" and args[1:2] and not args[1].startswith("-"):
            sub = args[1]
            if sub == "all":
                return _module_errors("tsm_ds.cli.bench", args[2:])
            if sub not in BENCHES:
                return [f"tsm-ds bench: unknown bench {sub}"]
            return _module_errors(BENCHES[sub][0], args[2:])
        return _module_errors(COMMANDS[args[0]][0], args[1:])
    if prog.startswith("python") and args[:1] == ["-m"] and len(args) > 1 and args[1].startswith("tsm_ds"):
        return _module_errors(args[1], args[2:])
    if prog == "deepspeed":
        if "--module" in args:
            i = args.index("--module") + 1
        else:
            i = next((k for k, a in enumerate(args) if a.endswith(".py")), len(args))
        errors = _unknown("deepspeed", args[:i], deepspeed_options())
        module = _script_module(args[i]) if i < len(args) else None
        return errors + (_module_errors(module, args[i + 1:]) if module else [])
    if prog == "sbatch":
        i = next((k for k, a in enumerate(args) if a.startswith("launch/")), None)
        if i is None:
            return []
        prog, args = "bash", args[i:]
    if prog == "bash" and args and args[0].startswith("launch/"):
        script, rest = args[0], args[1:]
        kind = {"launch/train_single_node.sh": "single", "launch/train_multi_node.sh": "multi",
                "launch/slurm_train.sbatch": "slurm"}.get(script)
        if kind:
            try:
                _, _, train_args = parse_launch_args(kind, rest, train_flags=sorted(module_options("tsm_ds.cli.train")))
            except LaunchArgsError as e:
                return [str(e)]
            return _module_errors("tsm_ds.cli.train", train_args)
        if script == "launch/slurm_prepare.sbatch":
            return _module_errors("tsm_ds.cli.prepare", rest)
        if script == "launch/quickstart.sh":
            return _module_errors("tsm_ds.cli.train", rest)
        if script == "launch/run_tests.sh":
            return []                                       # pytest's own arguments
        return _unknown(script, rest, script_help_options(script))
    return []


@pytest.mark.parametrize("block", bash_blocks(), ids=lambda b: b.name or f"{b.file}:{b.line}")
def test_every_flag_of_a_documented_command_is_accepted(block):
    errors = [e for cmd in shell_commands(block.body) for e in command_flag_errors(cmd)]
    assert errors == [], f"{block.file}:{block.line}"


def test_the_flag_check_finds_what_a_command_refuses():
    """Each kind of command line the check reads, with a flag its command would refuse."""
    bad = """tsm-ds train --data d --no-such-flag 1
tsm-ds bench scale --gpus 8 --bogus
tsm-ds frobnicate
python -m tsm_ds.cli.eval --checkpoint c --crops 3
deepspeed --num_gpu 2 tsm_ds/train.py --data d
deepspeed --num_gpus 2 --module tsm_ds.train --epoch 3
bash launch/train_multi_node.sh --hostfile h --master-addr a -- --data d
sbatch --nodes 2 launch/slurm_train.sbatch --data d --epochz 1
JOB=$(sbatch --array=0-3 launch/slurm_prepare.sbatch SRC OUT --part-count 4)
X=1 bash launch/quickstart.sh --epocs 2
"""
    errors = [command_flag_errors(c) for c in shell_commands(bad) if c != ["JOB=$"]]
    assert [len(e) for e in errors] == [1] * 10, errors
    assert "--no-such-flag" in errors[0][0] and "--bogus" in errors[1][0] and "frobnicate" in errors[2][0]
    assert "--master_addr" in errors[6][0]                  # the launcher names the spelling it accepts
    good = "tsm-ds train --data d --epochs 2 && deepspeed --num_gpus 2 tsm_ds/train.py --deepspeed_config cpu_fp32"
    assert [command_flag_errors(c) for c in shell_commands(good)] == [[], []]


def test_shell_commands_split_lines_operators_and_heredocs():
    body = "a --x 1 \\\n  --y 2   # note\nb | c; d && e\nJOB=$(f --g)\npython - <<EOF\nnot a command --z\nEOF\nh"
    assert shell_commands(body) == [["a", "--x", "1", "--y", "2"], ["b"], ["c"], ["d"], ["e"], ["JOB=$"],
                                    ["f", "--g"], ["python", "-"], ["EOF"], ["h"]]


# ---- links, words, the front page ----------------------------------------------------------------

def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but ``-`` and ``_`` dropped, spaces to ``-``."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of a Markdown file's headings (fenced blocks left out; repeats get -1, -2, ...)."""
    seen: dict[str, int] = {}
    out = set()
    for m in re.finditer(r"^#{1,6} (.+)$", _FENCE.sub("", path.read_text(encoding="utf-8")), re.M):
        s = slug(m.group(1))
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else f"{s}-{n}")
    return out


def test_slug_is_githubs():
    assert slug("Recipes (`--deepspeed_config`)") == "recipes---deepspeed_config"
    assert slug("The demo: temporal order that only TSM can see") == "the-demo-temporal-order-that-only-tsm-can-see"


def test_links_between_documents_resolve():
    broken = []
    for p in doc_files():
        text = _FENCE.sub("", p.read_text(encoding="utf-8"))
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"^[a-z]+:", target):
                continue                                    # https:, mailto:
            file, _, anchor = target.partition("#")
            dest = (p.parent / file).resolve() if file else p
            if not dest.exists():
                broken.append(f"{p.name}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{p.name}: {target} (no such heading)")
    assert broken == []


#: words of a lab notebook, not of a user guide (git holds the history)
BANNED = [r"\bissues? #?\d+", r"\b(first|second|previous) round\b", r"\bchanged from\b", r"\bprevious session\b"]


def test_no_issue_numbers_or_change_history():
    found = [f"{p.name}: {m.group(0)!r}" for p in doc_files() for pat in BANNED
             for m in re.finditer(pat, p.read_text(encoding="utf-8"), re.I)]
    assert found == []


def test_no_commit_hashes_of_this_repository():
    if subprocess.run(["git", "rev-parse", "--git-dir"], cwd=REPO, capture_output=True).returncode != 0:
        pytest.skip("not a git checkout")
    words = sorted({w for p in doc_files() for w in re.findall(r"\b[0-9a-f]{7,40}\b", p.read_text(encoding="utf-8"))})
    p = subprocess.run(["git", "cat-file", "--batch-check=%(objecttype)"], cwd=REPO, capture_output=True,
                       text=True, input="".join(f"{w}^{{commit}}\n" for w in words), timeout=60)
    hashes = [w for w, t in zip(words, p.stdout.splitlines()) if t == "commit"]
    assert hashes == []
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout
    p = subprocess.run(["git", "cat-file", "--batch-check=%(objecttype)"], cwd=REPO, capture_output=True,
                       text=True, input=f"{head.strip()}^{{commit}}\n")
    assert p.stdout.strip() == "commit"                    # the check would see one


def test_readme_is_a_front_page():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= README_MAX_LINES
    for guide in ("docs/getting-started.md", "docs/data.md", "docs/cluster.md"):
        assert f"]({guide}" in text, guide
    first = bash_blocks()[0]
    assert first.file == "README.md"
    lines = [ln.split("#")[0].strip() for ln in first.body.splitlines()]
    assert lines[:2] == ["bash launch/quickstart.sh", "bash launch/run_tests.sh"]


def _tracked_recipes() -> set[str]:
    p = subprocess.run(["git", "ls-files", "ds_configs/*.json"], cwd=REPO, capture_output=True, text=True)
    files = p.stdout.split() if p.returncode == 0 and p.stdout.strip() else \
        [str(f.relative_to(REPO)) for f in (REPO / "ds_configs").glob("*.json")]
    return {Path(f).stem for f in files}


def test_readme_recipe_table_lists_every_recipe():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## Recipes\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(\w+)` \|", section, re.M)
    assert sorted(rows) == sorted(_tracked_recipes())
    assert len(rows) == len(set(rows))


def test_readme_large_batch_row_is_the_committed_report():
    """The README's large-batch row says where the committed study stands, as its JSON does."""
    rep = json.loads((REPO / "results" / "large_batch" / "large_batch.json").read_text())
    row = next(ln for ln in (REPO / "README.md").read_text().splitlines() if ln.startswith("| large batch"))
    if rep["complete"]:
        assert f"study complete: {rep['landed']} runs" in row
    else:
        assert f"study in progress: {rep['landed']} of {rep['planned_total']} runs" in row
    from tsm_ds.experiments.large_batch.study_report import headline

    b = rep["settings"]["batches"]
    assert headline(rep["verdicts"], b[0], b[-1]) in row
    for k, words in (("x2", "with twice the epochs: "), ("half_lr", "at half the lr: ")):   # (a)'s isolation runs
        if rep["isolation"][k]:
            assert f"{words}{rep['isolation'][k]['top1']:.1f} %" in row
    for rc, d in rep["verdicts"].items():   # every verdict the report holds, pass / fail / pending
        assert ("pending" if d["verdict"] == "pending" else "passes" if d["verdict"] == "pass" else "fails") in row


# ---- the blocks the tests run ---------------------------------------------------------------------

def _free_port_shim(bindir: Path) -> None:
    """A ``deepspeed`` first on PATH that adds ``--master_port`` with a free port: the documented
    command as written, without colliding with another launcher on the machine (its 29500)."""
    real = Path(sys.executable).parent / "deepspeed"
    bindir.mkdir(parents=True, exist_ok=True)
    shim = bindir / "deepspeed"
    shim.write_text("#!/usr/bin/env bash\n"
                    f"port=$({sys.executable} -c 'import socket; s = socket.socket(); s.bind((\"127.0.0.1\", 0)); "
                    "print(s.getsockname()[1])')\n"
                    f'exec {real} --master_port "$port" "$@"\n')
    shim.chmod(0o755)


def sandbox(tmp_path: Path, shared: Path | None = None) -> Path:
    """A folder to run a block in, as from the repository root: ``tsm_ds``, ``ds_configs`` and
    ``launch`` linked, ``../shared/data`` the test clips when given; nothing written into the repo."""
    work = tmp_path / "work"
    work.mkdir()
    for name in ("tsm_ds", "ds_configs", "launch"):
        (work / name).symlink_to(REPO / name)
    if shared is not None:
        (tmp_path / "shared").mkdir()
        (tmp_path / "shared" / "data").symlink_to(shared)
    _free_port_shim(tmp_path / "bin")
    return work


def _run(name: str, tmp_path: Path, env: dict | None = None, shared: Path | None = None,
         timeout: int = 600, status: int = 0) -> tuple[subprocess.CompletedProcess, Path]:
    """Run block NAME as written (``set -euo pipefail``) in a sandbox and check its exit status;
    returns (process, sandbox)."""
    _, body = runnable_blocks()[name]
    work = sandbox(tmp_path, shared)
    script = tmp_path / f"{name}.sh"
    script.write_text("set -euo pipefail\n" + body + "\n")
    path = os.pathsep.join([str(tmp_path / "bin"), str(Path(sys.executable).parent), os.environ["PATH"]])
    full = {**os.environ, **(env or {}), "PATH": path}
    p = subprocess.run(["bash", str(script)], cwd=work, env=full, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == status, p.stdout[-4000:] + p.stderr[-4000:]
    return p, work


def _doc(name: str) -> str:
    return runnable_blocks()[name][0].read_text(encoding="utf-8")


@pytest.mark.slow
def test_readme_tour(tmp_path):
    """README's tour on generated clips: prepare, train in one process, eval, predict, 2 ranks."""
    p, work = _run("tour", tmp_path)
    tour = work / "tour"
    assert len(list((tour / "packed" / "train").rglob("*.jpack"))) == 32
    assert len(list((tour / "packed" / "val").rglob("*.jpack"))) == 8
    first = json.loads((tour / "runs" / "first" / "result.json").read_text())
    assert (first["status"], first["steps"], first["val_clips"]) == ("completed", 8, 8)
    assert json.loads((tour / "runs" / "first" / "config.json").read_text())["world_size"] == 1
    metrics = json.loads((tour / "eval" / "metrics.json").read_text())
    assert metrics["top1"] == pytest.approx(first["val_top1"])
    for clip in ("moving_up_0000.mp4", "moving_up_0001.mp4"):
        assert f"tour/data/val/moving_up/{clip}\n  1. " in p.stdout
    two = json.loads((tour / "runs" / "two_ranks" / "result.json").read_text())
    assert two["status"] == "completed" and two["steps"] == 8
    assert json.loads((tour / "runs" / "two_ranks" / "config.json").read_text())["world_size"] == 2


def test_data_guide_check_videos(tmp_path, shared_data):
    p, work = _run("check-videos", tmp_path, shared=shared_data, status=1)   # an unreadable file: exit 1
    doc = " ".join(_doc("check-videos").split())
    quoted = re.search(r"It prints `([^`]+)`", doc).group(1)
    assert quoted in p.stdout and "exits 1 when a file is unreadable" in doc
    rep = json.loads((work / "runs" / "edge_cases.json").read_text())
    assert "NoVideoStreamError: no video stream (audio-only or data-only file)" in json.dumps(rep)


@pytest.mark.slow
def test_training_guide_models_table_is_the_output(tmp_path):
    p, _ = _run("models", tmp_path)
    printed = [ln for ln in p.stdout.splitlines() if ln.startswith("|")]
    after = _doc("models").split("<!-- run: models -->", 1)[1].splitlines()
    start = next(i for i, ln in enumerate(after) if ln.startswith("| model |"))
    table = after[start:start + next(i for i, ln in enumerate(after[start:] + [""]) if not ln.startswith("|"))]
    assert table == printed
    assert len(printed) == 2 + 9


def test_training_guide_plan_for_1536_gpus(tmp_path):
    p, _ = _run("plan-1536", tmp_path)
    doc = _doc("plan-1536")
    for quoted in ("global batch 12288 = micro-batch 8 x accumulation 1 x 1536 ranks", "19 optimizer steps per epoch"):
        assert f"`{quoted}`" in doc.replace("\n", " ") and quoted in p.stdout
    assert re.search(r"optimizer\.params\.lr = 1\.92\b", p.stdout) and "lr 1.92" in doc


def test_cluster_guide_exit_codes_are_explain_exit():
    """docs/cluster.md's table is what ``launch_helper explain-exit`` prints for each status."""
    from tsm_ds.cli.launch_helper import answer

    doc = _doc("explain-exit")
    rows = re.findall(r"^\| (\d+) \| (.+) \|$", doc.split("## Exit codes", 1)[1].split("\n## ", 1)[0], re.M)
    assert [int(c) for c, _ in rows] == [0, 2, 3, 4, 5, 6, 7, 75, 255]
    for code, meaning in rows:
        rc, out, _ = answer("explain-exit", [code], {})
        assert rc == 0 and out.strip() == meaning.replace("`", ""), code


def test_cluster_guide_explain_exit_block(tmp_path):
    p, _ = _run("explain-exit", tmp_path)
    assert p.stdout.startswith("pdsh's status (DeepSpeed's multi-host launcher)")


def test_performance_guide_scaling_model(tmp_path):
    """The prediction and every what-if the guide quotes are those of the bench's report."""
    p, work = _run("bench-scale", tmp_path)
    doc = _doc("bench-scale")
    quoted = re.search(r"It prints `([^`]+)`", doc.replace("\n", " ")).group(1)
    assert quoted in p.stdout and "`I3D at 1536 GPUs: 21 min 54 s (1.78x TSM)`" in doc.replace("\n", " ")
    assert "I3D at 1536 GPUs: 21 min 54 s (1.78x TSM)" in p.stdout
    md = (work / "bench_out" / "scale" / "scale.md").read_text()
    rows = ([c.strip() for c in ln.strip().strip("|").split("|")] for ln in md.splitlines() if ln.startswith("| "))
    time_of = {r[0]: r[4] for r in rows if len(r) == 12}   # the what-if table
    flat = " ".join(doc.split())
    for what_if, said in [("bf16 comm", "bf16 communication"), ("1-bit comm", "1-bit"),
                          ("10 GbE network (1.25 GB/s)", "a 10 GbE network"), ("16 frames", "16 frames"),
                          ("3072 GPUs", "3,072 GPUs")]:
        assert f"{said} {time_of[what_if]}" in flat, what_if
    assert f"{time_of['h100 fp32 comm']} / {time_of['h200 fp32 comm']}" in flat
    for out in ("scale_10gbe", "scale_h100"):
        assert (work / "bench_out" / out / "scale.json").is_file()


@pytest.mark.slow
def test_shards_on_s3_guide(shared_data, tmp_path, moto_s3):
    """docs/shards.md: prepare, a new bucket, the upload, a 2-rank run from s3:// (moto on 127.0.0.1,
    its AWS_* variables set by the fixture) that loses nothing."""
    pytest.importorskip("litdata")
    videos = tmp_path / "videos"   # 3 classes x 2 real clips: a small copy of the guide's input
    for cls in ("tai_chi", "walking", "waving"):
        (videos / cls).mkdir(parents=True)
        for src in sorted((shared_data / "videos" / cls).iterdir())[:2]:
            (videos / cls / src.name).symlink_to(src)
    flags = ("--deepspeed_config ds_configs/cpu_fp32.json --arch resnet18 --num-segments 2 --img-size 32 "
             "--batch-size 2 --micro-batch-size 1 --num-workers 1 --no-progress --epochs 1 --max-steps 2 --seed 1 "
             f"--val-fraction 0.5 --output-dir {tmp_path / 'runs'} --run-name s3guide")
    p, _ = _run("shards-s3", tmp_path, {"VIDEOS": str(videos), "PREPARED": str(tmp_path / "prepared"),
                                        "BUCKET": "tsm-guide", "CACHE": str(tmp_path / "cache"), "GPUS": "2",
                                        "TRAIN_FLAGS": flags})
    uploaded = {ln.split()[1] for ln in p.stdout.splitlines() if ln.startswith("uploaded ")}
    assert uploaded == {f.name for f in (tmp_path / "prepared" / "shards").iterdir()}
    assert {"index.json", "samples.json"} < uploaded
    res = json.loads((tmp_path / "runs" / "s3guide" / "result.json").read_text())
    assert res["status"] == "completed" and res["steps"] == 2 and res["val_clips"] == 3
    assert {k: v["count"] for k, v in res["data_lost"].items()} == {"train": 0, "val": 0}
    assert list((tmp_path / "cache").rglob("chunk-*.bin"))   # fetched into the guide's cache
