"""Pulsar settings, each declared once.

A subsystem declares its settings as the fields of a frozen dataclass that
derives from :class:`Settings`, each field made by :func:`setting` with its
Pulsar key (as in broker.conf / proxy.conf), default, unit and help.  Every
other view is derived from that one declaration:

* the config-file reader, :meth:`Settings.from_properties` (``key=value``
  lines, ``#`` comments; other keys ignored, misspelt ones refused);
* the command-line flags, :func:`add_setting_flags` (``--field-name`` in
  kebab case, default None so that only what is given overrides the file)
  and :func:`setting_overrides`;
* the start-up line, :meth:`Settings.describe`, and :meth:`Settings.as_dict`
  for admin APIs and reports.

Example::

    @dataclass(frozen=True)
    class CacheSettings(Settings):
        size_mb: float = setting("managedLedgerCacheSizeMB", 512.0, "MB",
                                 "entry cache size (0 disables)")
        evict_ms: int = setting("managedLedgerCacheEvictionIntervalMs", 10, "ms",
                                "how often the cache is trimmed", minimum=1)

    cfg = CacheSettings.from_properties(Path("broker.conf"))
    ap = argparse.ArgumentParser()
    add_setting_flags(ap, CacheSettings)            # --size-mb, --evict-ms
    cfg = replace(cfg, **setting_overrides(ap.parse_args(), CacheSettings))

A setting whose default is a float takes any finite number (decimals allow
small test limits where Pulsar takes integers); one whose default is an int
takes integers only, so ``2.9`` or ``inf`` is refused rather than truncated.
Every value is checked against the setting's minimum and maximum, at
construction too: a bad value is a :class:`ConfigError` naming the field,
the unit and the range.  A bool default makes a switch (``true``/``false``
in a file; the flag ``--field-name`` turns on a setting that is off by
default, ``--no-field-name`` turns off one that is on), a str default with
``choices`` one of those names.  A simulator that sweeps a setting over
several values takes them with :func:`add_sweep_flag`.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import math
from pathlib import Path
from typing import Any, ClassVar, Optional, Sequence, TypeVar

#: Pulsar declares most settings as Java ints.
JAVA_INT_MAX = 2**31 - 1

S = TypeVar("S", bound="Settings")


class ConfigError(ValueError):
    """A setting that cannot be used: CLIs say so in one line (exit 2),
    admin APIs answer 400."""


def setting(key: str, default: Any, unit: str, doc: str, *, group: str = "settings",
            minimum: float = 0, maximum: float = JAVA_INT_MAX,
            choices: Sequence[str] = ()) -> Any:
    """setting declares one field of a Settings dataclass: its broker.conf /
    proxy.conf key, default, unit ("MB", "ms", "requests"...; "" for a
    switch or a choice), help text, group (a label to select settings by,
    e.g. for an admin API or a command's flags), and the range of accepted
    values.  An int default makes it an integer setting, a float default a
    number setting, a bool default a switch, a str default one of
    ``choices``."""
    if minimum > maximum:
        raise ValueError(f"{key}: minimum {minimum} is above maximum {maximum}")
    if isinstance(default, str) and default not in choices:
        raise ValueError(f"{key}: default {default!r} is not one of the choices {choices!r}")
    return dataclasses.field(default=default, metadata={
        "key": key, "unit": unit, "doc": doc, "group": group,
        "minimum": minimum, "maximum": maximum, "choices": tuple(choices)})


def is_setting(f: dataclasses.Field) -> bool:
    """is_setting says whether a dataclass field was declared by setting()."""
    return "key" in f.metadata


def _is_float(f: dataclasses.Field) -> bool:
    return isinstance(f.default, float)


def _is_switch(f: dataclasses.Field) -> bool:
    return isinstance(f.default, bool)


def _is_choice(f: dataclasses.Field) -> bool:
    return isinstance(f.default, str)


def _num(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return f"{v:g}" if isinstance(v, float) else str(v)


def _with_unit(v: Any, unit: str) -> str:
    return f"{_num(v)} {unit}" if unit else _num(v)


def check_value(f: dataclasses.Field, v: Any) -> None:
    """check_value raises ConfigError unless v suits setting f: a number (an
    integer for the integer settings), finite, within the setting's range;
    True or False for a switch; one of the choices for a choice."""
    if _is_switch(f):
        if not isinstance(v, bool):
            raise ConfigError(f"{f.name} must be true or false, not {v!r}")
        return
    if _is_choice(f):
        choices = f.metadata["choices"]
        if not isinstance(v, str) or v not in choices:
            raise ConfigError(f"{f.name} must be one of {', '.join(choices)}, not {v!r}")
        return
    kind = "a number" if _is_float(f) else "an integer"
    if isinstance(v, bool) or not isinstance(v, (int, float)) or \
            (not _is_float(f) and not isinstance(v, int)):
        raise ConfigError(f"{f.name} must be {kind}, not {v!r}")
    lo, hi = f.metadata["minimum"], f.metadata["maximum"]
    if not math.isfinite(v) or v < lo or v > hi:
        raise ConfigError(f"{f.name} must be {kind} from {_num(lo)} to "
                          f"{_with_unit(hi, f.metadata['unit'])}, not {v!r}")


def parse_value(f: dataclasses.Field, text: str) -> Any:
    """parse_value reads setting f from its text (int() for the integer
    settings, true/false in any case for a switch) and checks it;
    ConfigError if it does not suit."""
    if _is_switch(f):
        word = text.strip().lower()
        if word not in ("true", "false"):
            raise ConfigError(f"must be true or false, not {text!r}")
        return word == "true"
    if _is_choice(f):
        check_value(f, text.strip())
        return text.strip()
    try:
        v = float(text) if _is_float(f) else int(text)
    except ValueError:
        kind = "a number" if _is_float(f) else "an integer"
        raise ConfigError(f"must be {kind}, not {text!r}") from None
    check_value(f, v)
    return v


def closest_key(key: str, known, families=()) -> Optional[str]:
    """closest_key returns the known key that `key` looks like a misspelling
    of, if any: the same letters in another case, a close match, or (for a
    key starting with one of `families`, e.g. "maxTopicListInFlight") the
    nearest key at all."""
    known = list(known)
    folded = {k.lower(): k for k in known}
    if key.lower() in folded:
        return folded[key.lower()]
    near = difflib.get_close_matches(key, known, n=1, cutoff=0.85)
    if near:
        return near[0]
    if known and any(key.startswith(p) for p in families):
        return difflib.get_close_matches(key, known, n=1, cutoff=0.0)[0]
    return None


class Settings:
    """Base of a frozen dataclass whose fields are made by setting().

    Subclasses may set ``KEY_FAMILIES``: key prefixes of their own (a key in
    a config file that starts with one and matches no setting is surely a
    misspelling, so it is refused with the nearest key)."""

    KEY_FAMILIES: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self) -> None:
        for f in self.settings():
            check_value(f, getattr(self, f.name))

    @classmethod
    def settings(cls) -> tuple[dataclasses.Field, ...]:
        """The declared settings, in declaration order."""
        return tuple(f for f in dataclasses.fields(cls) if is_setting(f))

    @classmethod
    def setting_named(cls, name: str) -> dataclasses.Field:
        """The declaration of one setting, by field name; KeyError if none."""
        for f in cls.settings():
            if f.name == name:
                return f
        raise KeyError(name)

    def as_dict(self, group: Optional[str] = None) -> dict:
        """Values by field name (of one group, if given)."""
        return {f.name: getattr(self, f.name) for f in self.settings()
                if group is None or f.metadata["group"] == group}

    def describe(self) -> str:
        """One line with every setting and its unit (a start-up print)."""
        return ", ".join(f"{f.name} {_with_unit(getattr(self, f.name), f.metadata['unit'])}"
                         for f in self.settings())

    def table(self, group: Optional[str] = None) -> list[tuple[str, str, str]]:
        """(Pulsar key, value with its unit, command-line flag) per setting
        (of one group, if given): a report's settings block."""
        return [(f.metadata["key"], _with_unit(getattr(self, f.name), f.metadata["unit"]),
                 flag_of(f)) for f in self.settings()
                if group is None or f.metadata["group"] == group]

    @classmethod
    def from_properties(cls: type[S], path: Path, base: Optional[S] = None) -> S:
        """Read the settings from a broker.conf-style file (``key=value`` or
        ``key: value``, ``#``/``!`` comments) over `base` (the defaults if
        None).  Keys of other settings are ignored, as a broker.conf holds
        many; a key close to one of ours is a ConfigError naming the key it
        resembles, as is a value that does not suit (with file and line)."""
        by_key = {f.metadata["key"]: f for f in cls.settings()}
        values = {}
        for n, raw in enumerate(Path(path).read_text().splitlines(), 1):
            line = raw.strip()
            if not line or line.startswith(("#", "!")):
                continue
            key, sep, value = line.partition("=")
            if not sep:
                key, sep, value = line.partition(":")
            key, value = key.strip(), value.strip()
            f = by_key.get(key)
            if f is None:
                near = closest_key(key, by_key, cls.KEY_FAMILIES)
                if near:
                    raise ConfigError(f"{path}:{n}: unknown key {key}; did you mean {near}?")
                continue
            try:
                values[f.name] = parse_value(f, value)
            except ConfigError as exc:
                raise ConfigError(f"{path}:{n}: {key}: {exc}") from None
        try:
            return dataclasses.replace(base if base is not None else cls(), **values)
        except ConfigError as exc:
            raise ConfigError(f"{path}: {exc}") from None


def _flag_type(f: dataclasses.Field):
    def parse(text: str):
        try:
            return parse_value(f, text)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    parse.__name__ = ("switch" if _is_switch(f) else "choice" if _is_choice(f)
                      else "number" if _is_float(f) else "integer")
    return parse


def flag_of(f: dataclasses.Field) -> str:
    """The command-line flag of a setting: its field name in kebab case
    (``--no-`` before it for a switch that is on by default)."""
    name = f.name.replace("_", "-")
    return f"--no-{name}" if f.default is True else f"--{name}"


def _metavar(f: dataclasses.Field) -> str:
    unit = f.metadata["unit"]
    return unit.upper() if unit.isidentifier() else "N"


def _help(text: str) -> str:
    return text.replace("%", "%%")     # argparse formats help with %


def add_setting_flags(parser, cls: type[Settings], group: Optional[str] = None) -> None:
    """add_setting_flags adds one flag per setting of `cls` (of one group, if
    given) to an argparse parser or argument group (``--heap-mb`` for
    ``heap_mb``), default None so that only what is given overrides a config
    file; the help names the Pulsar key, the unit and the default.  A switch
    takes no value: its flag sets the key to the opposite of its default."""
    for f in cls.settings():
        if group is not None and f.metadata["group"] != group:
            continue
        doc, key = f.metadata["doc"], f.metadata["key"]
        if _is_switch(f):
            parser.add_argument(flag_of(f), dest=f.name, action="store_const",
                                const=not f.default, default=None,
                                help=_help(f"turns {'off' if f.default else 'on'}: {doc}; "
                                           f"sets {key}={_num(not f.default)} "
                                           f"(default {_num(f.default)})"))
            continue
        default = _with_unit(f.default, f.metadata["unit"])
        parser.add_argument(flag_of(f), dest=f.name, type=_flag_type(f), default=None,
                            metavar=None if _is_choice(f) else _metavar(f),
                            choices=f.metadata["choices"] or None,
                            help=_help(f"{doc}; overrides {key} (default {default})"))


def add_sweep_flag(parser, cls: type[Settings], name: str, default: Sequence) -> None:
    """add_sweep_flag adds the flag of setting `name` of `cls` (as
    add_setting_flags names it) taking a comma-separated list of values to
    sweep, each read and checked as that setting's; `default` when not
    given."""
    f = cls.setting_named(name)
    one = _flag_type(f)

    def parse(text: str) -> list:
        values = [one(x) for x in text.split(",") if x.strip()]
        if not values:
            raise argparse.ArgumentTypeError(f"expected comma-separated values, got {text!r}")
        return values
    parse.__name__ = "list"
    unit = f" ({f.metadata['unit']})" if f.metadata["unit"] else ""
    parser.add_argument(flag_of(f), dest=f.name, type=parse, default=list(default),
                        metavar=f"{_metavar(f)},...",
                        help=_help(f"{f.metadata['doc']}; the {f.metadata['key']} values to "
                                   f"sweep{unit}"))


def setting_overrides(namespace: argparse.Namespace, cls: type[Settings],
                      group: Optional[str] = None) -> dict:
    """setting_overrides returns the settings of `cls` (of one group, if
    given) set on the command line by add_setting_flags' flags, by field
    name, for ``dataclasses.replace``."""
    return {f.name: getattr(namespace, f.name) for f in cls.settings()
            if (group is None or f.metadata["group"] == group)
            and getattr(namespace, f.name, None) is not None}
