#!/usr/bin/env python3
"""gen_regex_cases.py - writes tests/unit/regex_cases.h, the cross-check
table of test_regex.c: ECMA-262 patterns, strings, and whether the string
matches, as Python's `re` (an independent implementation) decides it.

Each pattern is given twice: as ECMA-262 writes it (what spillway compiles)
and as a Python pattern with the same meaning, written by hand where the
two dialects differ: ECMA's `$` is Python's `\\Z` (Python's `$` also
matches before a final newline), `.` excludes \\r U+2028 U+2029 too, and
\\d \\w \\s are spelled as explicit classes (Python's are Unicode-aware,
ECMA's \\d and \\w are ASCII and its \\s is its own list). Strings are
random over a small alphabet per pattern (seeded: the output is stable)
plus a few fixed ones. Run it from the repository root:
    python3 tests/unit/gen_regex_cases.py > tests/unit/regex_cases.h
"""
import random
import re

DOT = "[^\\n\\r\\u2028\\u2029]"
SPACE = "[\\t\\n\\v\\f\\r \\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000\\ufeff]"
NSPACE = SPACE.replace("[", "[^", 1)

# (ecma, python, alphabet)
PATTERNS = [
    ("a", "a", "ab"),
    ("^a*$", "^a*\\Z", "ab"),
    ("a+", "a+", "ab"),
    ("^ab|cd$", "^ab|cd\\Z", "abcd"),
    ("^(ab|cd)$", "^(ab|cd)\\Z", "abcd"),
    ("^(?:ab)+c?$", "^(?:ab)+c?\\Z", "abc"),
    ("^a{3}$", "^a{3}\\Z", "ab"),
    ("^a{2,}$", "^a{2,}\\Z", "ab"),
    ("^a{1,3}b$", "^a{1,3}b\\Z", "ab"),
    ("^(a|b)*abb$", "^(a|b)*abb\\Z", "ab"),
    ("x[0-9]{2,3}y", "x[0-9]{2,3}y", "xy012"),
    ("^[^abc]+$", "^[^abc]+\\Z", "abcdé\n"),
    ("^.$", "^" + DOT + "\\Z", "a\n\r\u2028é€😀"),
    ("^..$", "^" + DOT + DOT + "\\Z", "a\né😀"),
    ("^\\d+$", "^[0-9]+\\Z", "0129a٣"),
    ("^\\D$", "^[^0-9]\\Z", "0a٣é"),
    ("^\\w+$", "^[A-Za-z0-9_]+\\Z", "aZ_9-é"),
    ("^\\W$", "^[^A-Za-z0-9_]\\Z", "a_-é "),
    ("^\\s$", "^" + SPACE + "\\Z", " \t\n\u00a0\u3000a\ufeff\u200b"),
    ("^\\S+$", "^" + NSPACE + "+\\Z", " a\u00a0é"),
    ("^[\\u00e0-\\u00ff]+$", "^[\\u00e0-\\u00ff]+\\Z", "aàÿĀé"),
    ("^[α-ω]{2}$", "^[α-ω]{2}\\Z", "αωΑa"),
    ("^[^α-ω]$", "^[^α-ω]\\Z", "αaΩ😀"),
    ("^[\\u{1F600}-\\u{1F64F}]$", "^[\\U0001F600-\\U0001F64F]\\Z", "😀🙏🚀a"),
    ("^\\uD83D\\uDE00$", "^\\U0001F600\\Z", "😀😁"),
    ("^[😀-🙏]+$", "^[\\U0001F600-\\U0001F64F]+\\Z", "😀🙏🚀"),
    ("^\\x41\\u0042\\t$", "^AB\\t\\Z", "AB\t "),
    ("^a\\/b$", "^a/b\\Z", "ab/"),
    ("^[\\]\\-\\\\]+$", "^[\\]\\-\\\\]+\\Z", "]-\\a"),
    ("^[a-]$", "^[a-]\\Z", "a-b"),
    ("^[-a]$", "^[-a]\\Z", "a-b"),
    ("^\\.\\*\\+\\?\\(\\)\\[\\]\\{\\}\\|\\^\\$$",
     "^\\.\\*\\+\\?\\(\\)\\[\\]\\{\\}\\|\\^\\$\\Z", ".*"),
    ("a|b|", "a|b|", "abc"),
    ("^(a|)+$", "^(a|)+\\Z", "ab"),
    ("^(a*)*b$", "^(a*)*b\\Z", "ab"),
    ("^a*?b+?$", "^a*?b+?\\Z", "ab"),
    ("^a{2,3}?$", "^a{2,3}?\\Z", "a"),
    ("^(?<x>ab)c$", "^(?P<x>ab)c\\Z", "abc"),
    ("[^]", "[\\s\\S]", "a\n"),
    ("^[^]$", "^[\\s\\S]\\Z", "a\né"),
    ("^[]$", "(?!)", "a"),
    ("a^b", "a^b", "ab"),
    ("a$b", "a\\Zb", "ab"),
    ("^$", "^\\Z", "a"),
    ("$^", "\\Z^", "a"),
    ("(^a|b$)", "(^a|b\\Z)", "abc"),
    ("^[0-9a-fA-F]{4}$", "^[0-9a-fA-F]{4}\\Z", "0aFg"),
    ("^\\cJ$", "^\\n\\Z", "\na"),
    ("^\\0$", "^\\x00\\Z", "\x00a"),
    ("^[\\d\\s]+$", "^[0-9" + SPACE[1:-1] + "]+\\Z", "1 a\t"),
    ("^[\\w.-]+@[\\w-]+\\.[a-z]{2,}$", "^[A-Za-z0-9_.-]+@[A-Za-z0-9_-]+\\.[a-z]{2,}\\Z", "ab.@-c"),
    ("^(\\([0-9]{3}\\))?[0-9]{3}-[0-9]{4}$", "^(\\([0-9]{3}\\))?[0-9]{3}-[0-9]{4}\\Z", "(12)-3"),
    ("{", "\\{", "{a"),
    ("^a{,2}$", "^a\\{,2\\}\\Z", "a{,2}"),
    ("^x{1}}$", "^x{1}\\}\\Z", "x}"),
    ("é+", "é+", "eé\u0301"),
    # lookahead (the rest of the string from that point)
    ("a(?=b)", "a(?=b)", "abc"),
    ("^a(?!b)", "^a(?!b)", "abc"),
    ("a(?=)", "a(?=)", "ab"),
    ("x(?!y)|y(?=x)", "x(?!y)|y(?=x)", "xy"),
    ("^(?!ab)[abc]+$", "^(?!ab)[abc]+\\Z", "abc"),
    ("^(?:a|(?=b)bc)c?$", "^(?:a|(?=b)bc)c?\\Z", "abc"),
    ("^(?=a$)", "^(?=a\\Z)", "ab"),
    ("^(?=.*\\d)(?=.*[a-z])[a-z\\d]{3,5}$",
     "^(?=" + DOT + "*[0-9])(?=" + DOT + "*[a-z])[a-z0-9]{3,5}\\Z", "a1b\n"),
    ("^(?!^b)b?", "^(?!^b)b?", "ab"),
    ("a(?!^)", "a(?!^)", "ab"),
    ("(?=(?!a)b)", "(?=(?!a)b)", "ab"),
    ("^(?:ab)?(?=b)", "^(?:ab)?(?=b)", "ab"),
    ("^(?:(?=a)a)*$", "^(?:(?=a)a)*\\Z", "ab"),
    ("^P(?:\\d+W|(?!.*W)(?=\\d|T\\d)(?:\\d+Y)?(?:\\d+D)?(?:T(?=\\d)(?:\\d+H)?(?:\\d+S)?)?)$",
     "^P(?:[0-9]+W|(?!" + DOT + "*W)(?=[0-9]|T[0-9])(?:[0-9]+Y)?(?:[0-9]+D)?(?:T(?=[0-9])"
     "(?:[0-9]+H)?(?:[0-9]+S)?)?)\\Z", "P1WTYDHS"),
    ("^(?!^[-+.]*$)[+-]?0*(?:\\d{0,2}|(?=[\\d.]{1,4}0*$)\\d{0,2}\\.\\d?0*$)",
     "^(?!^[-+.]*\\Z)[+-]?0*(?:[0-9]{0,2}|(?=[0-9.]{1,4}0*\\Z)[0-9]{0,2}\\.[0-9]?0*\\Z)",
     "0.15-+"),
    ("^\\p{L}+$", None, None),  # no Python equivalent: hand cases below
]

FIXED = ["", "a", "aa", "aaa", "ab", "abb", "abc", "\n", "é", "😀"]


def c_string(s):
    out = []
    for b in s.encode("utf-8"):
        if 0x20 <= b < 0x7F and chr(b) not in '"\\?':
            out.append(chr(b))
        else:
            out.append("\\%03o" % b)
    return '"' + "".join(out) + '"'


def main():
    rng = random.Random(15)
    print("/* regex_cases.h - GENERATED by tests/unit/gen_regex_cases.py from")
    print(" * Python's re (see that script); do not edit by hand. */")
    print("static const struct regex_xcase {")
    print("    const char *pattern, *text;")
    print("    size_t text_len;")
    print("    bool match;")
    print("} g_xcases[] = {")
    for ecma, py, alpha in PATTERNS:
        if py is None:
            continue
        rx = re.compile(py)
        seen = set()
        texts = list(FIXED)
        for _ in range(60):
            n = rng.randint(0, 6)
            texts.append("".join(rng.choice(alpha) for _ in range(n)))
        for t in texts:
            if t in seen:
                continue
            seen.add(t)
            m = rx.search(t) is not None
            print("    {%s, %s, %d, %s}," % (c_string(ecma), c_string(t), len(t.encode("utf-8")),
                                           "true" if m else "false"))
    print("};")


if __name__ == "__main__":
    main()
