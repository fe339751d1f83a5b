"""``mrcstack fault`` (:mod:`mrcstack.netns.faults.cli`) without a testbed: bad arguments,
the testbed it acts on, a missing testbed, scenario checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mrcstack.netns import cli as testbed_cli
from mrcstack.netns.faults import cli as fault_cli
from tests.support import REPO


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["loss", "p0:t0a-t1a", "--rate", "2"], "must be in (0, 1]"),
        (["loss", "p0:t0a-t1a"], "--rate is required"),
        (["loss"], "give a link"),
        (["loss", "--path", "p0-t1a", "p0-t0a", "--rate", "0.1"], "takes no link ends"),
        (["shape", "a", "b", "c", "--rate", "1mbit"], "too many arguments"),
        (["shape", "p0:t0a-t1a", "--rate", "fast"], "bad rate"),
        (["trim", "p0:t0a-t1a", "--rate", "1mbit"], "--threshold is required"),
        (["link", "sideways", "p0:t0a-t1a"], "invalid choice"),
        (["nic", "down", "h0", "zero"], "argument PLANE"),
        (["--name", "tc", "explode"], "invalid choice"),
    ],
)
def test_cli_bad_arguments_exit_2_with_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        fault_cli.main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_both_clis_act_on_mrc_testbed_unless_given_a_name(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("mrcstack.netns.state.STATE_DIR", tmp_path)
    monkeypatch.setenv("MRC_TESTBED", "tenv")
    for main, argv in ((fault_cli.main, ["link", "down", "p0:t0a-t1a"]),
                       (testbed_cli.main, ["down"])):  # fmt: skip
        assert main(argv) == 1
        assert "no testbed named 'tenv'" in capsys.readouterr().err
        assert main([*argv, "--name", "tflag"]) == 1
        assert "no testbed named 'tflag'" in capsys.readouterr().err
    monkeypatch.setenv("MRC_TESTBED", "Not-a-name")
    with pytest.raises(SystemExit) as info:
        fault_cli.main(["list"])
    assert info.value.code == 2
    assert testbed_cli.main(["status"]) == 2
    errors = capsys.readouterr().err.splitlines()
    assert len(errors) == 2 and all("bad testbed name 'Not-a-name'" in e for e in errors)


def test_cli_missing_testbed_and_bad_scenario(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("mrcstack.netns.state.STATE_DIR", tmp_path)
    assert fault_cli.main(["--name", "nope", "link", "down", "p0:t0a-t1a"]) == 1
    assert "no testbed named 'nope'" in capsys.readouterr().err
    bad = tmp_path / "bad.toml"
    bad.write_text('[[step]]\nat = "1s"\naction = "link_down"\nlink = "p0:t0a-t9a"\n')
    assert fault_cli.main(["scenario", str(bad), "--check"]) == 2
    assert "step 1: link: bad link" in capsys.readouterr().err
    example = str(REPO / "examples" / "scenario-flap.toml")
    assert fault_cli.main(["--json", "scenario", example, "--check"]) == 0
    timeline = json.loads(capsys.readouterr().out)
    assert len(timeline) == 19 and timeline[0]["method"] == "link_down"
    assert fault_cli.main(["--name", "nope", "list"]) == 0
    assert capsys.readouterr().out.strip() == "no active faults"
