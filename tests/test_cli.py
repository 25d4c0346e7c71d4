"""The conventions every `python -m pylimiter...` command keeps
(pylimiter.spark.cli): --version, defaults in --help, exit statuses, --out
checks, and numbers with units."""

from __future__ import annotations

import os

import pytest

from pylimiter import __version__
from pylimiter.spark.cli import (
    UsageError,
    fmt_bytes,
    fmt_rate,
    fmt_seconds,
    make_parser,
    positive_float,
    positive_int,
    require,
    run,
    subparsers,
    writable_dir,
)


def _parser():
    ap = make_parser("prog", "Does a thing.")
    ap.add_argument("--n", type=positive_int, default=5, help="how many")
    ap.add_argument("--rate", type=positive_float, default=0.5, help="per second")
    ap.add_argument("--names", default=["a", "b"], help="names")
    ap.add_argument("--flag", action="store_true", help="a switch")
    ap.add_argument("--out", type=writable_dir, default=None, help="output folder")
    sub = subparsers(ap, dest="cmd")
    s = sub.add_parser("go", help="go")
    s.add_argument("--steps", type=int, default=60, help="steps")
    return ap


def test_version_and_defaults_in_help(capsys):
    ap = _parser()
    with pytest.raises(SystemExit) as e:
        ap.parse_args(["--version"])
    assert e.value.code == 0
    assert f"pylimiter-pulsar {__version__}" in capsys.readouterr().out
    text = " ".join(ap.format_help().split())
    assert "how many (default: 5)" in text and "per second (default: 0.5)" in text
    assert "names (default: a,b)" in text
    assert "a switch (default" not in text and "output folder (default" not in text
    sub_help = " ".join(ap._subparsers._group_actions[0].choices["go"].format_help().split())
    assert "steps (default: 60)" in sub_help


@pytest.mark.parametrize("argv, needle", [
    (["--n", "0"], "must be at least 1, got 0"),
    (["--n", "x"], "expected an integer, got 'x'"),
    (["--rate", "inf"], "must be a finite number > 0"),
    (["--rate", "-1"], "must be a finite number > 0"),
])
def test_bad_values_are_usage_errors(capsys, argv, needle):
    with pytest.raises(SystemExit) as e:
        _parser().parse_args(argv)
    assert e.value.code == 2
    assert needle in capsys.readouterr().err


def test_out_folder_is_created_or_refused_in_one_line(tmp_path, capsys):
    made = tmp_path / "a" / "b"
    assert _parser().parse_args(["--out", str(made)]).out == made and made.is_dir()
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(SystemExit) as e:
        _parser().parse_args(["--out", str(blocker / "sub")])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert f"cannot write to {blocker / 'sub'}" in err[-1]
    if os.geteuid() != 0:                     # root can write anywhere
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        with pytest.raises(SystemExit):
            _parser().parse_args(["--out", str(ro)])


def test_run_maps_errors_to_exit_statuses(capsys):
    def usage(argv):
        raise UsageError("bad input file x.csv: no column 'topic'")

    def broken(argv):
        raise RuntimeError("disk full\nsecond line")

    def interrupted(argv):
        raise KeyboardInterrupt

    assert run(lambda argv: 0, "p") == 0
    assert run(usage, "p") == 2
    assert capsys.readouterr().err == "p: error: bad input file x.csv: no column 'topic'\n"
    assert run(broken, "p") == 1
    assert capsys.readouterr().err == "p: error: RuntimeError: disk full\n"
    assert run(interrupted, "p") == 130
    assert capsys.readouterr().err == "p: interrupted\n"


def test_require_names_the_extra():
    require(["json"], "spark")
    with pytest.raises(UsageError, match=r"no_such_mod_xyz is missing .*"
                                         r"pip install '\.\[spark\]' in a pylimiter checkout"):
        require(["json", "no_such_mod_xyz"], "spark")


def test_numbers_with_units():
    assert fmt_bytes(512) == "512 B" and fmt_bytes(1536) == "1.5 KiB"
    assert fmt_bytes(3 * 1024 ** 3) == "3.0 GiB"
    assert fmt_seconds(0.000123) == "123 µs" and fmt_seconds(0.25) == "250.0 ms"
    assert fmt_seconds(12.34) == "12.3 s" and fmt_seconds(75) == "1 min 15 s"
    assert fmt_rate(1_234_567, "rows") == "1.23 M rows/s" and fmt_rate(12, "req") == "12.0 req/s"


def test_list_and_range_types():
    import argparse

    from pylimiter.spark.cli import fraction, name_list, non_negative_float, number_list, port

    assert non_negative_float("0") == 0.0 and fraction("1") == 1.0 and port("65535") == 65535
    assert name_list(["a", "b"])("b, a") == ["b", "a"]
    assert number_list(int, 1)("1,2") == [1, 2]
    assert number_list(float, 0, "shares", maximum=1)("0,0.5") == [0.0, 0.5]
    for parse, text, needle in [
        (non_negative_float, "-1", "must be a finite number >= 0"),
        (non_negative_float, "nan", "must be a finite number >= 0"),
        (fraction, "1.5", "must be between 0 and 1"),
        (port, "70000", "must be a port number 0..65535"),
        (name_list(["a"]), "a,z", "unknown 'z'; choose from a"),
        (name_list(["a"]), ",", "unknown '(empty)'"),
        (number_list(int, 1, "counts"), "1,x", "expected comma-separated counts"),
        (number_list(int, 1, "counts"), "0", "expected counts >= 1"),
        (number_list(float, 0, "shares", maximum=1), "2", "between 0 and 1"),
        (number_list(float, 0), "inf", "expected numbers >= 0"),
    ]:
        with pytest.raises(argparse.ArgumentTypeError) as e:
            parse(text)
        assert needle in str(e.value)
