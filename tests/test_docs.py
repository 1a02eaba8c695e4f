"""The README and docs/ say what is built: their code runs as printed and prints what
they show, their links lead somewhere, their tables name tests that exist.

Every ```python block of README.md and docs/*.md runs, one of four ways, by what
it talks to:

* ``"mydaemon"``: alone, against one real daemon started as the docs start it
  (``rte serve --name mydaemon ...``), its output compared with the ```text block
  that follows it, which it must have;
* ``connect("pool")``: the same, against a pool started as the docs start it;
* ``import rte.ray``: on a local Ray cluster (only with the ``ray`` extra);
* anything else: a doc's other blocks are one script, run in order (a block may
  use what an earlier one defined), whose output is every ```text block after
  them, in order. Without torch the script stops before its first block that
  imports torch, and the rest is skipped, naming the extra.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from child_python import python_c
from daemon_harness import DaemonProcess

from rte.client import connect
from rte.errors import EngineGone
from shm.names import shm_name, unlink_objects

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
README = ROOT / "README.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.S | re.M)
TORCH = importlib.util.find_spec("torch") is not None
RAY = importlib.util.find_spec("ray") is not None


@dataclass(frozen=True)
class Snippet:
    """A python block of a doc, what it prints (the text block after it, if any),
    and how it runs."""

    doc: Path
    line: int
    code: str
    shown: str | None

    @property
    def kind(self) -> str:
        if '"mydaemon"' in self.code:
            return "daemon"
        if 'connect("pool")' in self.code:
            return "pool"
        if "import rte.ray" in self.code:
            return "ray"
        return "script"

    def __str__(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"


def fenced(doc: Path) -> list[tuple[str, str, int]]:
    """Every fenced block of ``doc``: (language, text, line it starts on)."""
    text = doc.read_text()
    return [(m[1], m[2], text.count("\n", 0, m.start()) + 1) for m in FENCE.finditer(text)]


def snippets(doc: Path) -> list[Snippet]:
    blocks = fenced(doc)
    found = []
    for i, (language, code, line) in enumerate(blocks):
        if language == "python":
            after = blocks[i + 1] if i + 1 < len(blocks) else None
            shown = after[1] if after is not None and after[0] == "text" else None
            found.append(Snippet(doc, line, code, shown))
    return found


def every(kind: str) -> list[Snippet]:
    return [s for doc in DOCS for s in snippets(doc) if s.kind == kind]


def serve_lines(name: str) -> set[tuple[str, ...]]:
    """The arguments of every ``rte serve --name NAME ... &`` line in the docs."""
    pattern = re.compile(rf"rte serve --name {name}([^&\n]*)&")
    return {tuple(m.split()) for doc in DOCS for m in pattern.findall(doc.read_text())}


def run_python(code: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``code`` in a child process of the checkout's rte, as a reader's snippet runs."""
    return python_c(code, timeout=timeout, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})


def assert_prints(snippet: str, code: str, shown: str, timeout: float = 120) -> str:
    done = run_python(code, timeout)
    assert done.returncode == 0, f"{snippet} fails:\n{done.stderr}"
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stdout == shown, f"{snippet} prints:\n{done.stdout}\nthe doc shows:\n{shown}"
    return done.stdout


@pytest.fixture
def prefix() -> Iterator[str]:
    """A unique name part; whatever is left under it in /dev/shm is removed, and fails."""
    name = f"t{os.getpid()}x{uuid.uuid4().hex[:10]}"
    yield name
    assert unlink_objects(shm_name(name)) == []


@pytest.fixture(scope="module")
def mydaemon() -> Iterator[DaemonProcess]:
    (args,) = serve_lines("mydaemon")  # every doc starts it the same way
    prefix = f"t{os.getpid()}x{uuid.uuid4().hex[:10]}"
    d = DaemonProcess(f"{prefix}docs", *args, "--max-sessions", "4")
    d.client().close()  # up
    yield d
    assert d.stop() == 0, d.stderr
    assert unlink_objects(shm_name(prefix)) == []


# -- the code runs as printed ---------------------------------------------------


def test_the_docs_have_snippets_of_every_kind_each_daemon_one_with_its_output() -> None:
    kinds = {s.kind for doc in DOCS for s in snippets(doc)}
    assert kinds == {"daemon", "pool", "ray", "script"}
    assert len(every("daemon")) >= 4
    assert all(s.shown is not None for s in every("daemon") + every("pool")), "no output"
    assert serve_lines("mydaemon") == {("--pace-hz", "30")}


def test_the_readme_shows_a_client_in_twenty_lines_with_what_it_prints() -> None:
    (first, *_) = snippets(README)
    assert first.kind == "daemon" and first.shown
    assert len(first.code.strip().splitlines()) <= 20


@pytest.mark.parametrize("snippet", every("daemon"), ids=str)
def test_a_daemon_snippet_runs_as_printed_and_prints_what_it_shows(
    mydaemon: DaemonProcess, snippet: Snippet
) -> None:
    code = "from rte.client import connect\n" + snippet.code  # some continue the first
    assert snippet.shown is not None
    assert_prints(str(snippet), code.replace('"mydaemon"', repr(mydaemon.name)), snippet.shown)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("snippet", every("pool"), ids=str)
def test_a_pool_snippet_runs_against_a_pool_started_as_the_docs_say(
    prefix: str, snippet: Snippet
) -> None:
    (args,) = serve_lines("pool")
    name = f"{prefix}pool"
    pool = DaemonProcess(name, *args)
    try:
        deadline = time.monotonic() + 90
        while True:  # up: every member answers
            try:
                with connect(name, timeout=5) as client:
                    if len(getattr(client, "members", [None, None])) == 2:
                        break
            except EngineGone:
                pass
            assert pool.process.poll() is None, pool.said()
            assert time.monotonic() < deadline, pool.said()
            time.sleep(0.2)
        code = snippet.code.replace('connect("pool")', f"connect({name!r})")
        done = run_python(code)
        assert done.returncode == 0, done.stderr
        assert done.stdout.replace(name, "pool") == snippet.shown
    finally:
        assert pool.stop() == 0, pool.stderr


@pytest.mark.ray
@pytest.mark.timeout(300)
@pytest.mark.parametrize("snippet", every("ray"), ids=str)
def test_a_ray_snippet_runs_on_a_local_cluster(snippet: Snippet) -> None:
    if not RAY:
        pytest.skip("needs the ray extra: pip install -e '.[ray]'")
    done = run_python(snippet.code, timeout=280)
    assert done.returncode == 0, done.stderr
    assert done.stdout == (snippet.shown or "")


def test_the_model_written_from_scratch_is_served_as_the_doc_says(
    tmp_path: Path, prefix: str
) -> None:
    doc = ROOT / "docs" / "writing-a-model.md"
    served = re.search(r"`rte serve --name dots --model (dot:Dot)`", doc.read_text())
    assert served is not None, "the doc no longer says how to serve the model"
    (tmp_path / "dot.py").write_text(snippets(doc)[0].code)  # the class, as printed
    path = os.pathsep.join([str(tmp_path), str(TESTS), str(ROOT)])
    daemon = DaemonProcess(f"{prefix}dots", "--model", served[1], env={"PYTHONPATH": path})
    try:
        with daemon.client() as client:
            assert client.manifest.latent_shape == (8, 8, 3)
            client.attach("carol", {"prompt": "blue", "move": (1, 1)})
            chunk = client.poll(timeout=30)
            assert chunk is not None and chunk.session == "carol"
            with chunk:  # written by draw straight into the slab: blue at 1,1
                assert chunk.latent[1, 1].tolist() == [0, 0, 255]
    finally:
        assert daemon.stop() == 0, daemon.stderr


def script(doc: Path, prefix: str) -> tuple[str, str, bool]:
    """``doc``'s script blocks as one program, the output they show, and whether a
    block was left out (it imports torch, which is not installed)."""
    code, shown, cut = [], [], False
    for snippet in snippets(doc):
        if snippet.kind != "script":
            continue
        if not TORCH and re.search(r"^\s*(import|from) torch\b", snippet.code, re.M):
            cut = True
            break
        code.append(snippet.code.replace('"example"', repr(prefix)))  # unique shm names
        shown.append(snippet.shown or "")
    return "\n".join(code), "".join(shown), cut


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "doc", [d for d in DOCS if any(s.kind == "script" for s in snippets(d))], ids=lambda d: d.name
)
def test_a_doc_s_other_snippets_run_in_order_and_print_what_it_shows(
    doc: Path, prefix: str
) -> None:
    code, shown, cut = script(doc, prefix)
    assert_prints(doc.name, code, shown, timeout=280)
    if cut:
        pytest.skip(f"{doc.name}: the snippets from the first to import torch need the torch extra")


# -- what the docs name exists ----------------------------------------------------


def slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(doc: Path) -> set[str]:
    text = FENCE.sub("", doc.read_text())
    return {slug(h) for h in re.findall(r"^#+ (.*)$", text, re.M)}


def links(doc: Path) -> list[str]:
    text = FENCE.sub("", doc.read_text())
    return re.findall(r"\]\(([^)\s]+)\)", text)


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: d.name)
def test_every_link_leads_to_a_file_and_heading_in_the_repository(doc: Path) -> None:
    for link in links(doc):
        if re.match(r"\w+://", link):
            continue
        path, _, anchor = link.partition("#")
        target = (doc.parent / path).resolve() if path else doc
        assert target.exists(), f"{doc.name} links to {link}: no such file"
        assert ROOT in target.parents or target == ROOT, f"{doc.name}: {link} leaves the checkout"
        if anchor:
            assert anchor in anchors(target), f"{doc.name} links to {link}: no such heading"


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: d.name)
def test_no_doc_points_at_what_users_do_not_have(doc: Path) -> None:
    text = doc.read_text()
    assert "../shared" not in text and "shared/DESIGN" not in text, doc.name


def test_the_readme_has_a_table_of_contents_and_leads_to_every_doc() -> None:
    text = README.read_text()
    linked = {(README.parent / link.partition("#")[0]).resolve() for link in links(README)}
    assert sorted(d.name for d in DOCS[1:] if d.resolve() not in linked) == []
    sections = {slug(h) for h in re.findall(r"^## (.*)$", text, re.M)} - {"contents"}
    contents = text[text.index("**Contents:**") : text.index("\n## ")]
    assert {a for a in re.findall(r"\]\(#([\w-]+)\)", contents)} == sections


def test_the_readme_s_test_command_is_what_ci_runs() -> None:
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    blocks = [block for language, block, _ in fenced(README) if language == "sh"]
    commands = [line for block in blocks for line in block.splitlines()]
    assert ci in commands


def rows_and_tests(doc: Path) -> list[tuple[str, list[tuple[str, str | None]]]]:
    """Every data row of ``doc``'s tables, with the tests its last column names:
    (file, test function or None); a bare name is in the file named before it."""
    lines = re.findall(r"^\|.*\|[ \t]*$", doc.read_text(), re.M)
    headers = {lines[i - 1] for i, line in enumerate(lines) if set(line) <= set("|-: ")}
    found = []
    for row in lines:
        if row in headers or set(row) <= set("|-: "):
            continue
        last = row.strip().strip("|").split(" | ")[-1]
        current, named = None, []
        for name in re.findall(r"`([^`]+)`", last):
            file, _, test = name.partition("::")
            if file.endswith(".py"):
                current = file
                named.append((file, test or None))
            elif current is not None and re.fullmatch(r"(::)?test_\w+", name):
                named.append((current, name.removeprefix("::")))
        found.append((row, named))
    return found


def test_every_row_of_the_failure_model_names_tests_that_exist() -> None:
    rows = rows_and_tests(ROOT / "docs" / "failure-model.md")
    assert len(rows) >= 60
    assert [row for row, named in rows if not named] == [], "rows that name no test"
    missing = []
    for file, test in (each for _, named in rows for each in named):
        path = TESTS / file
        if not path.exists() or (test and not re.search(rf"def {test}\(", path.read_text())):
            missing.append(f"{file}::{test}" if test else file)
    assert missing == [], "the failure model names tests that do not exist"


# -- the benchmark tables are generated into their doc --------------------------


def test_every_benchmark_table_has_its_place_in_the_benchmarks_doc() -> None:
    from tools import readme_tables  # noqa: PLC0415

    text = (ROOT / "docs" / "benchmarks.md").read_text()
    names = re.findall(r"^<!-- ([\w ]+) -->$", text, re.M)
    assert names == [name for _, name, _ in readme_tables.TABLES]


def test_the_readme_s_state_table_is_the_benchmarks_doc_s() -> None:
    """The README shows the state suite's table of one run, the one docs/benchmarks.md
    shows (both written by readme_tables from that run)."""

    def table(text: str) -> str:
        at = text.index("<!-- state -->\n") + len("<!-- state -->\n")
        return text[at : text.index("\n\n", at)]

    shown = table(README.read_text())
    assert shown.startswith("| figure |") and shown == table(
        (ROOT / "docs" / "benchmarks.md").read_text()
    )


def test_write_replaces_a_run_s_tables_and_its_line_and_nothing_else(tmp_path: Path) -> None:
    from tools import bench_engine, readme_tables  # noqa: PLC0415

    run: dict[str, object] = {"machine": "m", "date": "d", "windows": 2}
    run["engine"] = bench_engine.run([1, 4], steps=20, n_windows=2)
    doc = tmp_path / "benchmarks.md"
    doc.write_text((ROOT / "docs" / "benchmarks.md").read_text())
    before = doc.read_text().splitlines()
    assert readme_tables.write(doc, run) == ["engine"]
    after = doc.read_text().splitlines()
    made = readme_tables.render(run).splitlines()
    table = made[made.index("<!-- engine -->") : readme_tables._table_span(made, 1)]
    start = before.index("<!-- engine -->")
    assert after[start : start + len(table)] == table  # the run's table: rows 1 and 4
    assert [row.split(" |")[0] for row in table[3:]] == ["| 1", "| 4"]
    end = readme_tables._table_span(before, start)
    assert after[start + len(table) :] == before[end:]  # the rest, unchanged
    line = max(i for i in range(start) if before[i].startswith("<!-- from one"))
    assert after[line] == made[0] and after[:line] == before[:line]
    (tmp_path / "other.md").write_text("no tables here\n")
    with pytest.raises(SystemExit, match="has no '<!-- engine -->'"):
        readme_tables.write(tmp_path / "other.md", run)
