"""docs/INVARIANTS.md stays true: every invariant a header states has a row, and every test a
row names exists.

(a) Every comment line of a header in shm/, client/include/, client/src/, daemon/ and cli/ that
    states an `Invariant:` (or `Invariants:`) must appear, by its first words, in a row of the
    section of docs/INVARIANTS.md for that header.
(b) Every test the page names must exist: a gtest `Suite.Name` (or `Prefix/Suite.Name/*`) as a
    TEST, TEST_F or TEST_P in tests/ (with an INSTANTIATE_TEST_SUITE_P of that prefix for a
    parameterized one), a python test `bindings/python/tests/FILE.py::test_name` as a function in that
    file.
"""
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[3]
DOC = ROOT / "docs" / "INVARIANTS.md"
HEADER_GLOBS = ("shm/*.h", "client/include/**/*.h", "client/src/*.h", "daemon/*.h", "cli/*.h")
# How many words of an invariant a row must quote.
QUOTED_WORDS = 8

INVARIANT = re.compile(r"^\s*(?://|/\*|\*)?\s*.*?\b(Invariants?:.*)$")
GTEST_DECL = re.compile(r"\bTEST(?:_F|_P)?\(\s*(\w+)\s*,\s*(\w+)\s*\)")
INSTANTIATE = re.compile(r"\bINSTANTIATE_TEST_SUITE_P\(\s*(\w+)\s*,\s*(\w+)\s*,")
CITED = re.compile(r"`([^`\s]+)`")
GTEST_NAME = re.compile(r"^(?:(\w+|\*)/)?([A-Z]\w*)\.([A-Z]\w*)(?:/(?:\*|\w+))?$")
PY_NAME = re.compile(r"^(bindings/python/tests/[\w/]+\.py)::(\w+)$")


def words(text):
    """The words of `text`, lower case, without punctuation or markup."""
    return re.findall(r"<=|>=|\w+", text.lower())


def headers():
    for pattern in HEADER_GLOBS:
        yield from sorted(ROOT.glob(pattern))


def header_invariants():
    """(header path, the invariant's first words) for every Invariant line of every header."""
    found = []
    for path in headers():
        for line in path.read_text().splitlines():
            m = INVARIANT.match(line)
            if m and ("//" in line or line.lstrip().startswith(("*", "/*"))):
                found.append((str(path.relative_to(ROOT)), words(m.group(1))[:QUOTED_WORDS]))
    return found


def doc_sections():
    """{header path: the text of its section}; a section may name several headers."""
    sections = {}
    current = []
    for line in DOC.read_text().splitlines():
        if line.startswith("## "):
            current = []
            base = ""
            for name in (n.strip() for n in line[3:].split(",")):
                if "/" in name:
                    base = name.rsplit("/", 1)[0]
                elif base:
                    name = f"{base}/{name}"
                if name.endswith(".h"):
                    current.append(name)
                    sections.setdefault(name, "")
            continue
        for name in current:
            sections[name] += line + "\n"
    return sections


def gtest_declarations():
    tests, prefixes = set(), set()
    for path in (ROOT / "tests").rglob("*.cc"):
        text = path.read_text()
        tests.update(GTEST_DECL.findall(text))
        prefixes.update(INSTANTIATE.findall(text))
    return tests, prefixes


def cited_tests():
    """Every backticked test name in a table row's last column."""
    names = []
    for line in DOC.read_text().splitlines():
        if not line.startswith("|") or line.startswith("|---"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or cells[0] == "invariant":
            continue
        for name in CITED.findall(cells[-1]):
            if GTEST_NAME.match(name) or PY_NAME.match(name):
                names.append(name)
    return names


def test_the_page_exists_and_names_tests():
    assert DOC.exists(), f"{DOC.relative_to(ROOT)} is missing"
    assert len(cited_tests()) > 50, "docs/INVARIANTS.md names almost no tests"


def test_every_invariant_line_of_a_header_has_a_row():
    invariants = header_invariants()
    assert invariants, "no `Invariant:` line found in the headers: has the pattern changed?"
    sections = doc_sections()
    missing = []
    for header, first_words in invariants:
        quoted = " ".join(first_words)
        if header not in sections:
            missing.append(f"{header}: no section `## {header}` in docs/INVARIANTS.md "
                           f"(its invariant: \"{quoted} ...\")")
        elif quoted not in " ".join(words(sections[header])):
            missing.append(f"{header}: no row quoting \"{quoted} ...\" in its section")
    assert not missing, "invariants without an entry in docs/INVARIANTS.md:\n  " + \
        "\n  ".join(missing)


def test_every_test_the_page_names_exists():
    tests, prefixes = gtest_declarations()
    unknown = []
    for name in cited_tests():
        py = PY_NAME.match(name)
        if py:
            path = ROOT / py.group(1)
            if not path.exists() or not re.search(rf"^def {py.group(2)}\(", path.read_text(), re.M):
                unknown.append(f"{name}: no such python test")
            continue
        prefix, suite, test = GTEST_NAME.match(name).groups()
        if (suite, test) not in tests:
            unknown.append(f"{name}: no TEST/TEST_F/TEST_P({suite}, {test}) in tests/")
        elif prefix == "*" and not any(s == suite for _, s in prefixes):
            unknown.append(f"{name}: {suite} is not parameterized")
        elif prefix and prefix != "*" and (prefix, suite) not in prefixes:
            unknown.append(f"{name}: no INSTANTIATE_TEST_SUITE_P({prefix}, {suite}, ...) in tests/")
        elif not prefix and any(s == suite for _, s in prefixes):
            unknown.append(f"{name}: {suite} is parameterized; name it as Prefix/{suite}.{test}/*")
    assert not unknown, "docs/INVARIANTS.md names tests that do not exist:\n  " + \
        "\n  ".join(unknown)
