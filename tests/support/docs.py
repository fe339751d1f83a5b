"""The command examples of the README and docs/, as tests run them.

- A ``console`` block is an example with its output: ``$ COMMAND`` (continued over lines
  ending in a backslash), then exactly what it prints.  The prose paragraph right after
  the block may quote figures, but only ones the block shows.
- Lines of ``sh`` blocks are commands to paste; :func:`commands` finds those that run a
  given program (every ``tshark`` line, say), so a test runs them exactly as written.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tests.support import REPO

#: The files whose examples are checked: the README and every page of docs/ (the
#: experiments' generated report excepted: it quotes what its own run produced).
DOCS = (REPO / "README.md", *sorted((REPO / "docs").glob("*.md")))
_FENCE = re.compile(r"^```(\w*)\s*$")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    lang: str
    lines: tuple[str, ...]
    after: str  # the prose paragraph that follows the block

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"


@dataclass(frozen=True)
class Example:
    """One ``$ COMMAND`` of a console block and the output quoted under it."""

    block: Block
    command: str
    output: str


def blocks(path: Path) -> list[Block]:
    lines = path.read_text().splitlines()
    out = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        k = end + 1
        while k < len(lines) and not lines[k].strip():
            k += 1
        para = []
        while k < len(lines) and lines[k].strip() and not lines[k].startswith("```"):
            para.append(lines[k])
            k += 1
        out.append(Block(path, i + 1, m.group(1), tuple(lines[i + 1 : end]), " ".join(para)))
        i = end + 1
    return out


def examples(paths: tuple[Path, ...] = DOCS) -> list[Example]:
    """Every ``$ COMMAND`` of every console block, with the output quoted under it."""
    out = []
    for path in paths:
        for block in (b for b in blocks(path) if b.lang == "console"):
            command: list[str] = []
            output: list[str] = []
            for line in block.lines:
                if line.startswith("$ "):
                    if command:
                        out.append(Example(block, "\n".join(command), "\n".join(output)))
                    command, output = [line[2:]], []
                elif command and not output and command[-1].endswith("\\"):
                    command.append(line)
                else:
                    output.append(line)
            if command:
                out.append(Example(block, "\n".join(command), "\n".join(output)))
    return out


def commands(program: str, paths: tuple[Path, ...] = DOCS) -> list[tuple[str, str]]:
    """``(where, line)`` for every line of an ``sh`` block that runs ``program``, in order."""
    word = re.compile(rf"(^|[\s/]){re.escape(program)}(\s|$)")
    out = []
    for path in paths:
        for block in (b for b in blocks(path) if b.lang == "sh"):
            for n, line in enumerate(block.lines, block.line + 1):
                code = line.split(" #", 1)[0].strip()
                if code and not code.startswith("#") and word.search(code):
                    out.append((f"{path.relative_to(REPO)}:{n}", code))
    return out


def unquoted_figures(example: Example) -> list[str]:
    """Numbers in the prose after the example (code spans aside: those are flags to try)
    that neither its command nor its output has."""
    shown = example.command + "\n" + example.output
    prose = re.sub(r"`[^`]*`", " ", example.block.after)
    return [n for n in _NUMBER.findall(prose) if n not in shown]
