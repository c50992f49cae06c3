# jsonschema_check.py - the independent judge of generated JSON
# (tests/schema_check.c runs it): every output of every record must parse
# as JSON and validate with python3-jsonschema under its schema.
#
# Input: a file of JSON lines {"file": F, "group": G, "schema": S,
# "outputs": [TEXT, ...], "tests": [{"data", "valid", "description"}]}
# (tests: a suite group's own, optional). The validator class is the one the schema's
# "$schema" names (2020-12 when it names none), with format checking on:
# the engine enforces the formats it knows, so they are checked as
# assertions even where the draft calls them annotations.
#
# Debian's python3-jsonschema checks some formats only with optional
# packages that Debian does not ship (date-time, time, duration, hostname).
# Where the installed jsonschema has no checker for one of those, a strict
# one written here from RFC 3339 / ISO 8601 / RFC 1123 is added, and the
# report names it, so a reader knows which checks are not jsonschema's own.
# relative-json-pointer, time and date-time are always this script's own
# (REPLACEMENTS: a jsonschema version in use refuses valid ones).
#
# Prints per file: outputs, invalid, not checkable (Python's re cannot
# compile some ECMA-262 patterns, e.g. \p{L}), not judged (see "tests"
# below); lists each invalid output.
# Exit status 1 when any output is invalid or does not parse.
import datetime
import json
import re
import sys

import jsonschema
from jsonschema.validators import validator_for

try:
    from importlib.metadata import version
    JS_VERSION = version("jsonschema")
except Exception:  # pragma: no cover
    JS_VERSION = "?"

_DT = re.compile(r"^(\d{4})-(\d\d)-(\d\d)[Tt](\d\d):(\d\d):(\d\d)(\.\d+)?([Zz]|[+-](\d\d):(\d\d))$")
_TIME = re.compile(r"^(\d\d):(\d\d):(\d\d)(\.\d+)?([Zz]|[+-](\d\d):(\d\d))$")
_DUR = re.compile(r"^P(?:\d+W|(?=\d|T\d)(?:\d+Y)?(?:\d+M)?(?:\d+D)?(?:T(?=\d)(?:\d+H)?(?:\d+M)?(?:\d+S)?)?)$")
_LABEL = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")


def _clock_ok(h, mi, s, off_h, off_m):
    if off_h is not None and (int(off_h) > 23 or int(off_m) > 59):
        return False
    return int(h) <= 23 and int(mi) <= 59 and int(s) <= 60


def check_date_time(s):
    if not isinstance(s, str):
        return True
    m = _DT.match(s)
    if not m:
        return False
    try:
        datetime.date(int(m.group(1)), int(m.group(2)), int(m.group(3)))
    except ValueError:
        return False
    return _clock_ok(m.group(4), m.group(5), m.group(6), m.group(9), m.group(10))


def check_time(s):
    if not isinstance(s, str):
        return True
    m = _TIME.match(s)
    return bool(m) and _clock_ok(m.group(1), m.group(2), m.group(3), m.group(6), m.group(7))


def check_duration(s):
    return not isinstance(s, str) or bool(_DUR.match(s))


def check_hostname(s):
    if not isinstance(s, str):
        return True
    if not s or len(s) > 253:
        return False
    return all(_LABEL.match(label) for label in s.split("."))


_REL_PTR = re.compile(r"^(?:0|[1-9][0-9]*)(?:[+-](?:0|[1-9][0-9]*))?(?:#|(?:/(?:[^/~]|~[01])*)*)$")


def check_relative_json_pointer(s):
    # draft-bhutton-relative-json-pointer-00: a non-negative integer, an
    # optional index manipulation (2020-12's draft; draft 7's has none, and
    # accepting it here only widens the judge), then "#" or a JSON pointer
    return not isinstance(s, str) or bool(_REL_PTR.match(s))


SUPPLEMENTS = {"date-time": check_date_time, "time": check_time, "duration": check_duration,
               "hostname": check_hostname}

# Formats whose installed checker is replaced outright, because a version in
# use gets it wrong: jsonschema 4.26 refuses "6704#" as a relative JSON
# pointer (a non-negative integer then "#" is one), and refuses every leap
# second ("23:59:60Z", which RFC 3339 section 5.6 and the suite's own
# time and date-time tests call valid).
REPLACEMENTS = {"relative-json-pointer": check_relative_json_pointer, "time": check_time,
                "date-time": check_date_time}


def format_checker(cls):
    fc = cls.FORMAT_CHECKER
    added = []
    for name, fn in SUPPLEMENTS.items():
        if name not in fc.checkers:
            fc.checks(name)(fn)
            added.append(name)
    for name, fn in REPLACEMENTS.items():
        if fc.checkers.get(name, (None,))[0] is not fn:
            fc.checks(name)(fn)
        added.append(name)
    return fc, added


def main(path):
    per_file = {}
    order = []
    bad_total = 0
    supplemented = set()
    for line in open(path, encoding="utf-8"):
        r = json.loads(line)
        f = r["file"]
        if f not in per_file:
            per_file[f] = [0, 0, 0, 0]
            order.append(f)
        k = per_file[f]
        cls = validator_for(r["schema"], default=jsonschema.Draft202012Validator)
        fc, added = format_checker(cls)
        supplemented.update(added)
        v = cls(r["schema"], format_checker=fc)
        plain = cls(r["schema"])  # the suite's own reading: format an annotation
        # A suite group carries its own tests: where this validator disagrees
        # with the suite on them, its verdict on this schema is not to be
        # trusted (a bug of that jsonschema version); the outputs are then
        # counted apart, and named.
        wrong = []
        for t in r.get("tests", []):
            try:
                if plain.is_valid(t["data"]) != t["valid"]:
                    wrong.append(t["description"])
            except Exception:
                wrong.append(t["description"])
        if wrong:
            k[3] += len(r["outputs"])
            print("UNJUDGED %s / %s: %d outputs: the validator disagrees with the suite on "
                  "its own test(s) %s" % (f, r["group"], len(r["outputs"]), wrong))
            continue
        for out in r["outputs"]:
            try:
                value = json.loads(out)
            except ValueError as e:
                k[1] += 1
                bad_total += 1
                print("INVALID %s / %s: %r does not parse: %s" % (f, r["group"], out[:200], e))
                continue
            try:
                errs = list(v.iter_errors(value))
            except Exception as e:
                k[2] += 1  # re cannot read the pattern
                print("UNCHECKABLE %s / %s: %s: %s" % (f, r["group"], out[:120], repr(e)[:160]))
                continue
            k[0] += 1
            if errs:
                k[1] += 1
                bad_total += 1
                print("INVALID %s / %s: %s : %s" % (f, r["group"], out[:200], errs[0].message[:200]))
    print("jsonschema %s (%s): per file: outputs validated, invalid, not checkable, "
          "not judged (the validator fails the suite's own tests of the group)"
          % (JS_VERSION, jsonschema.__file__.rsplit("/", 2)[0]))
    if supplemented:
        print("  formats checked by this script's own checkers (the installed jsonschema has "
              "none, or gets it wrong: %s): %s" % (", ".join(sorted(REPLACEMENTS)),
                                                   ", ".join(sorted(supplemented))))
    tot = [0, 0, 0, 0]
    for f in order:
        k = per_file[f]
        print("  %-44s %5d %3d %3d %3d" % (f, k[0], k[1], k[2], k[3]))
        for i in range(4):
            tot[i] += k[i]
    print("  %-44s %5d %3d %3d %3d" % ("TOTAL", tot[0], tot[1], tot[2], tot[3]))
    return 1 if bad_total else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
