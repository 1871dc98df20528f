"""The README and docs/ cannot drift from the code: every relative link resolves (file and
heading), every `accel ...` line in a code block is accepted by the CLI's own parser."""

from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from accel import cli

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
COMMAND = re.compile(r"^(?:\$ )?(?:[A-Z_]+=\S+ )*(accel .*)$")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def headings(page: Path) -> set[str]:
    return {slug(line.lstrip("#")) for line in prose(page) if re.match(r"^#+ ", line)}


def prose(page: Path) -> list[str]:
    """The page's lines outside code blocks."""
    out, fenced = [], False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced:
            out.append(line)
    return out


def code_lines(page: Path) -> list[str]:
    """The page's lines inside code blocks, with `\\` continuations joined."""
    out, fenced, pending = [], False, ""
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            continue
        line = f"{pending} {line.strip()}" if pending else line.strip()
        pending = line[:-1] if line.endswith("\\") else ""
        if not pending:
            out.append(line)
    return out


def relative_links(page: Path) -> list[str]:
    links = (m.group(1) for line in prose(page) for m in LINK.finditer(line))
    return [link for link in links if not re.match(r"^[a-z]+:", link)]


def command_lines(page: Path) -> list[str]:
    return [m.group(1) for line in code_lines(page) if (m := COMMAND.match(line))]


def link_problem(page: Path, link: str) -> str | None:
    """Why a relative link on page does not resolve, or None."""
    path, _, anchor = link.partition("#")
    target = (page.parent / path).resolve() if path else page
    if not target.exists():
        return f"{page.name}: {link}: no file {target}"
    if anchor and target.suffix == ".md" and anchor not in headings(target):
        return f"{page.name}: {link}: no heading #{anchor} in {target.name}"
    return None


def command_problem(line: str) -> str | None:
    """Why the CLI would refuse this documented command line, or None. A synopsis
    (`accel best --study NAME [--storage URL]`) is checked for its option names only."""
    argv = shlex.split(line, comments=True)[1:]
    _, commands = cli.build_parser()
    if not argv or argv[0] not in commands:
        return f"{line}: no command {argv[:1]}; the commands are {sorted(commands)}"
    if "[" in line:
        known = set(commands[argv[0]]._option_string_actions)
        flags = {f for f in re.findall(r"--[a-z][\w-]*", line)}
        return f"{line}: unknown options {sorted(flags - known)}" if flags - known else None
    try:
        cli.parse(argv)
    except SystemExit as e:
        return f"{line}: refused by the parser (exit {e.code})"
    return None


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_resolves(page):
    problems = [p for link in relative_links(page) if (p := link_problem(page, link))]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_documented_command_line_parses(page, capsys):
    problems = [p for line in command_lines(page) if (p := command_problem(line))]
    assert not problems, "\n".join(problems)


def test_the_checks_catch_a_broken_link_and_a_broken_command(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Top\n\n[ok](page.md#top) [gone](missing.md) [no anchor](page.md#nope)\n\n"
                    "```\naccel train --no-such-flag\naccel frobnicate\n"
                    "accel best --study x [--no-such-option URL]\naccel best --study x\n```\n")
    problems = [link_problem(page, link) for link in relative_links(page)]
    assert [p is None for p in problems] == [True, False, False]
    lines = command_lines(page)
    assert len(lines) == 4
    assert [command_problem(line) is None for line in lines] == [False, False, False, True]


TEST_REF = re.compile(r"`(test_\w+\.py)::(\w+)")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_named_test_exists(page):
    """`test_x.py::test_name` in a page (the reliability table, say) names a real test."""
    missing = [f"{file}::{name}" for file, name in TEST_REF.findall(page.read_text())
               if not (ROOT / "tests" / file).exists()
               or not re.search(rf"^\s*def {name}\(", (ROOT / "tests" / file).read_text(), re.M)]
    assert not missing, f"{page.name} names tests that do not exist: {missing}"


def test_the_readme_fits_on_a_screen_or_so():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 300


MODEL_URI = re.compile(r"models:/([A-Za-z0-9][\w.-]*)")
REGISTERS = re.compile(r"--register[ =]([A-Za-z0-9][\w.-]*)")


def unregistered_models(page: Path) -> list[str]:
    """`models:/NAME...` uses on the page whose NAME neither an earlier line of the page nor the
    README registers (`--register NAME`); NAME in capitals is a placeholder."""
    registered = set(REGISTERS.findall((ROOT / "README.md").read_text()))
    problems = []
    for number, line in enumerate(page.read_text().splitlines(), 1):
        registered |= set(REGISTERS.findall(line))
        problems += [f"{page.name}:{number}: models:/{name} is registered nowhere before it"
                     for name in MODEL_URI.findall(line)
                     if name not in registered and not name.isupper()]
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_model_a_page_uses_is_registered_on_it_or_in_the_readme(page):
    problems = unregistered_models(page)
    assert not problems, "\n".join(problems)


def test_the_model_check_catches_a_name_no_example_registers(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("accel evaluate models:/digits-cnn@champion\nmodels:/NAME@ALIAS\n"
                    "accel best --study s --register mine\nmodels:/mine/2 models:/digits@x\n")
    assert [p.split(": ", 1)[1] for p in unregistered_models(page)] == [
        "models:/digits is registered nowhere before it"]


def serving_recipe(page: Path) -> tuple[str, str]:
    """(the `mlflow models serve` command, the Python client) as the page shows them."""
    blocks = re.findall(r"```(\w*)\n(.*?)```", page.read_text(), re.S)
    serve = [b for _, b in blocks if "mlflow models serve" in b]
    client = [b for lang, b in blocks if lang == "python" and "/invocations" in b]
    assert len(serve) == 1 and len(client) == 1, f"{page.name}: one serve command, one client"
    return serve[0], client[0]


def test_the_serving_recipe_is_what_test_serving_runs():
    """docs/registry.md's serve command is, word for word, the `mlflow models serve` that
    tests/test_serving.py runs against a registered model (the store named by
    MLFLOW_TRACKING_URI), and its Python client is valid Python that posts `{"inputs": ...}` to
    /invocations and names the classes from the model's metadata."""
    serve, client = serving_recipe(ROOT / "docs" / "registry.md")
    words = shlex.split(serve.replace("\\\n", " "))
    assert words == ["MLFLOW_TRACKING_URI=sqlite:///mlruns/mlflow.db", "mlflow", "models", "serve",
                     "-m", "models:/digits-cnn@champion", "--env-manager", "local",
                     "-h", "127.0.0.1", "-p", "5001"], words
    compile(client, "registry.md", "exec")
    for text in ('"http://127.0.0.1:5001/invocations"', 'json.dumps({"inputs": x.tolist()})',
                 '["predictions"]', 'get_model_info("models:/digits-cnn@champion")',
                 '.metadata["classes"]'):
        assert text in client, text


# make test covers it: the same recipe against a real `mlflow models serve`:
# test_serving.py::test_the_serving_recipe_works_as_pasted_against_mlflow_models_serve; the
# page's blocks are those words: test_the_serving_recipe_is_what_test_serving_runs
@pytest.mark.slow
def test_the_serving_recipe_runs_as_written(tmp_path):
    """docs/registry.md's serving recipe pasted into a shell and a Python prompt, after the
    page's own registration (its first `--register NAME`, alias champion) of a tiny study; only
    the store's path and the port are changed."""
    from tests.conftest import register_tiny_model, stop_group
    from tests.test_scale_out import free_port

    page = ROOT / "docs" / "registry.md"
    serve, client = serving_recipe(page)
    store, _ = register_tiny_model(tmp_path, REGISTERS.findall(page.read_text())[0], "champion")
    port, default_store = str(free_port()), "sqlite:///mlruns/mlflow.db"
    assert default_store in serve and default_store in client and "5001" in serve + client
    venv = str(Path(sys.executable).parent)  # `.venv` activated: mlflow and uvicorn on PATH
    env = {**os.environ, "PATH": f"{venv}{os.pathsep}{os.environ['PATH']}"}
    env.pop("MLFLOW_TRACKING_URI", None)
    log = tmp_path / "serve.log"
    with open(log, "w") as out:
        server = subprocess.Popen(["bash", "-c", serve.replace(default_store, store)
                                   .replace("5001", port)], cwd=tmp_path, env=env,
                                  start_new_session=True, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 240
        while time.time() < deadline:
            assert server.poll() is None, log.read_text()[-3000:]
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2).close()
                break
            except OSError:
                time.sleep(1)
        answer = subprocess.run([sys.executable, "-c", client.replace(default_store, store)
                                 .replace("5001", port)], cwd=tmp_path, env=env,
                                capture_output=True, text=True, timeout=120)
    finally:
        stop_group(server)
    assert answer.returncode == 0, answer.stderr[-3000:] + log.read_text()[-2000:]
    predicted = ast.literal_eval(answer.stdout.strip())
    assert len(predicted) == 1 and predicted[0] in [str(d) for d in range(10)], answer.stdout


def test_the_readme_shows_the_data_step_before_the_first_cifar_command():
    """`accel train experiments/cifar10_cpu.yaml` needs the shared CIFAR-10 extracted first: the
    README's code shows that step (a module that exists) before any CIFAR experiment."""
    import importlib.util

    lines = code_lines(ROOT / "README.md")
    cifar = next(i for i, line in enumerate(lines) if "experiments/cifar10" in line)
    steps = [line.split("#")[0].split() for line in lines[:cifar]]
    assert ["python", "-m", "accel.shared_data"] in steps, lines[cifar]
    assert importlib.util.find_spec("accel.shared_data") is not None
