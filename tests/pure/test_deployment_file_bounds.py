"""The bounds of a deployments file (``keeper.client.deployment_file``, docs/design.md §7.7,
"Bounds"): no alias, at most 64 levels of nesting, at most 1 MiB, each refused naming its line
and the limit; and ``exo-deploy apply -f FILE --dry-run`` fuzzed through the CLI's own ``main``
with files drawn from a grammar of valid and broken ones: it exits 0 or 2 (1 or 3 never: the
service is a stand-in that lists nothing), with no traceback, whatever the file."""

from __future__ import annotations

import contextlib
import io
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import keeper.cli.apply as apply_cli
from keeper.cli import main
from keeper.client.deployment_file import (
    FILE_KEYS,
    MAX_DEPTH,
    MAX_FILE_BYTES,
    DeploymentFileError,
    parse_deployment_file,
)
from keeper.client.deployments import Answer
from keeper.model.api_models import DeploymentsResponse

ENTRY = "deployments:\n  - model: m/x\n"


def problems(text: str) -> list[str]:
    with pytest.raises(DeploymentFileError) as raised:
        parse_deployment_file(text, "f")
    return raised.value.lines()


def nested(depth: int) -> str:
    """A file whose value ``replicas`` is nested ``depth`` levels below the top mapping's 3."""
    return ENTRY + "    replicas: " + "[" * depth + "1" + "]" * depth + "\n"


def test_an_alias_is_refused_at_its_line() -> None:
    text = ENTRY + "    replicas: &two 2\n  - model: m/y\n    replicas: *two\n"
    assert problems(text) == [
        "f:5:15: aliases (*name) are not read in a deployments file: write the value out"
    ]


def test_a_merge_key_is_an_alias_too() -> None:
    text = "base: &base {replicas: 2}\n" + ENTRY + "    <<: *base\n"
    assert problems(text)[0].startswith("f:4:9: aliases (*name) are not read")


def test_the_alias_bomb_is_refused_at_once() -> None:
    """Ten levels of ten aliases in under 500 bytes: 10^10 values once built (or printed)."""
    levels = ["&a0 [x,x,x,x,x,x,x,x,x,x]"]
    levels += [f"&a{i} [" + ",".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 10)]
    text = ENTRY + "    replicas: [" + ", ".join(levels) + "]\n"
    assert len(text) < 600
    (problem,) = problems(text)
    assert problem.startswith("f:3:48: aliases (*name) are not read")


def test_an_anchor_no_alias_uses_is_harmless() -> None:
    (request,) = parse_deployment_file(ENTRY + "    replicas: &r 2\n", "f")
    assert request.replicas == 2


def test_nesting_to_the_limit_is_read_and_past_it_refused_naming_line_and_limit() -> None:
    # The top mapping, the list and the entry are 3 levels: the value may add the rest.
    at_limit = problems(nested(MAX_DEPTH - 3))  # read: only its value is wrong
    assert "replicas: Input should be a valid integer" in at_limit[0]
    (past,) = problems(nested(MAX_DEPTH - 2))
    column = len("    replicas: ") + MAX_DEPTH - 2
    assert past == f"f:3:{column}: nested deeper than 64 levels, the most a deployments file may be"


def test_deep_nesting_is_refused_not_a_recursion_error() -> None:
    (problem,) = problems("deployments: " + "[" * 100_000 + "]" * 100_000 + "\n")
    assert problem == "f:1:77: nested deeper than 64 levels, the most a deployments file may be"


def test_a_file_of_1_mib_is_read_and_one_byte_more_refused_naming_the_line() -> None:
    body = ENTRY + "    replicas: 2\n"
    filler = MAX_FILE_BYTES - len(body)
    comment = "#" + "x" * 99 + "\n"
    padded = body + comment * (filler // len(comment)) + "#" * (filler % len(comment))
    assert len(padded.encode()) == MAX_FILE_BYTES
    assert [r.replicas for r in parse_deployment_file(padded, "f")] == [2]
    (problem,) = problems(padded + "#")
    lines = padded.count("\n") + 1
    assert problem == (
        f"f: larger than 1 MiB, the most a deployments file may be (the limit falls in line "
        f"{lines})"
    )


def test_the_size_counts_bytes_not_characters() -> None:
    """A model id of multi-byte characters: 1 MiB of text is less than 1 MiB of characters."""
    text = ENTRY + "#" + "é" * (MAX_FILE_BYTES // 2) + "\n"
    assert len(text) < MAX_FILE_BYTES < len(text.encode())
    assert "larger than 1 MiB" in problems(text)[0]


# --- apply -f through the CLI, fuzzed --------------------------------------------------------

SCALARS = [
    "mlx-community/Qwen3-0.6B-4bit",
    "m/x",
    "1",
    "2",
    "99",
    "-1",
    "true",
    "null",
    "~",
    "''",
    "Pipeline",
    "Tensor",
    "MlxRing",
    "MlxJaccl",
    "2.5",
    "!!int abc",
    "!!python/object:os.system x",
    "!!binary aGk=",
    "!!timestamp x",
    "*a",
    "&a 1",
    "[1, 2]",
    "{a: 1}",
    "'unterminated",
    '"\\x"',
    "\t",
]
KEYS = [*FILE_KEYS, "modle", "<<", "version", "deployments", "? x", "'model'", "1"]


@st.composite
def entries(draw: st.DrawFn) -> str:
    pairs = draw(st.lists(st.tuples(st.sampled_from(KEYS), st.sampled_from(SCALARS)), max_size=6))
    if draw(st.booleans()):
        pairs.insert(0, ("model", draw(st.sampled_from(SCALARS[:3]))))
    if not pairs:
        return "  - {}\n"
    lines = [f"{key}: {value}" for key, value in pairs]
    return "  - " + "\n    ".join(lines) + "\n"


@st.composite
def files(draw: st.DrawFn) -> str:
    """A file of the grammar (a version, a list of entries of the known keys and others), then
    perhaps broken: a token put anywhere, nesting to some depth, an alias bomb, a size past the
    limit."""
    version = draw(st.sampled_from(["", "version: 1\n", "version: 2\n", "version: true\n"]))
    listed = "".join(draw(st.lists(entries(), max_size=4)))
    text = version + ("deployments:\n" + listed if listed else "deployments: []\n")
    breakage = draw(st.sampled_from(["none", "token", "nest", "bomb", "size", "bytes"]))
    if breakage == "token":
        token = draw(st.sampled_from(["[", "]", "{", "}", ":", "- ", "\n", "  ", "&a ", "*a", "'"]))
        at = draw(st.integers(0, len(text)))
        text = text[:at] + token + text[at:]
    elif breakage == "nest":
        depth = draw(st.integers(1, 3 * MAX_DEPTH))
        text += "  - model: m/deep\n    replicas: " + "[" * depth + "1" + "]" * depth + "\n"
    elif breakage == "bomb":
        levels = ["&b0 [x,x,x,x,x,x,x,x,x,x]"]
        levels += [f"&b{i} [" + ",".join([f"*b{i - 1}"] * 10) + "]" for i in range(1, 10)]
        text += "  - model: m/bomb\n    replicas: [" + ", ".join(levels) + "]\n"
    elif breakage == "size":
        text += "#" * (MAX_FILE_BYTES + draw(st.integers(-2, 2)))
    elif breakage == "bytes":
        text += draw(st.sampled_from(["\x00", "\x85", "\ufeff", "\udcff"]))
    return text


@pytest.fixture
def no_service(monkeypatch: pytest.MonkeyPatch) -> None:
    """The service ``apply`` asks for its deployments: it has none (nothing else is asked in a
    dry run)."""
    listing = Answer(DeploymentsResponse(deployments=[]), {"deployments": []})
    monkeypatch.setattr(apply_cli, "call_master", lambda args, call: listing)  # pyright: ignore[reportUnknownLambdaType]


@contextlib.contextmanager
def file_of(text: str) -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "deployments.yaml"
        path.write_bytes(text.encode("utf-8", errors="surrogateescape"))
        yield path


def run_apply(path: Path) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(["apply", "-f", str(path), "--dry-run", "--url", "http://127.0.0.1:9"])
        except SystemExit as exit_:
            code = exit_.code
    assert isinstance(code, int)
    return code, out.getvalue(), err.getvalue()


@pytest.mark.usefixtures("no_service")
@settings(max_examples=300, deadline=None)
@given(text=files())
def test_apply_dry_run_of_any_file_exits_0_or_2_and_never_a_traceback(text: str) -> None:
    with file_of(text) as path:
        code, out, err = run_apply(path)
    assert "Traceback" not in out + err
    if code == 0:
        assert out.splitlines()[-1] == "dry run: nothing applied"
        assert err == ""
    else:
        assert code == 2, err
        assert err.splitlines()[-1].endswith("nothing applied")
        assert all(line.startswith(("exo-deploy apply: ", str(path))) for line in err.splitlines())
