#!/usr/bin/python3
"""Checks that the monitoring files use only metrics the real binaries export.

Usage:
  check_metric_names.py --retryd BIN --retryctl BIN --rules FILE --dashboard FILE
                        --promtool BIN [--rule-tests FILE]

Starts the real daemon (BIN --config=...) on a segment of its own, in a temp dir, with one
dependency in each mode and a metrics textfile; reads `retryctl metrics` (and the textfile,
which must export the same families); stops the daemon and removes the segment. Then it
reads every PromQL expression of the alert rules (`expr`), of the Grafana dashboard (panel
targets, and the `label_values(...)` queries of its variables) and the series of the rule
unit tests (`input_series`), and fails, naming file, place and expression, if one uses:
  - a metric name that is not in the real output;
  - a label the metric does not have (besides `instance` and `job`, which the scrape adds),
    or a label value (`=` matchers, and each word of a `=~"a|b"` matcher) it never takes;
  - a gauge inside rate()/irate()/increase() or a counter used without one;
  - a label in by/without/on/ignoring that no retryd metric has.
It checks that every alert has a unit test case where it fires and one where it must not
(`exp_alerts: []`), and that every retryd_fleet_* family and every histogram has a dashboard
panel. It also checks
the dashboard's shape: schemaVersion >= 36, a datasource variable, an instance variable, and
every panel and target on the datasource variable. Last, it writes the dashboard's expressions
(Grafana variables replaced) into a rule file and has `promtool check rules` parse them; a
promtool that is missing (Debian: prometheus) is a failure.

Python 3 standard library plus PyYAML (Debian: python3-yaml). Exit 0 on success, 1 with the
list of problems otherwise.
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

try:
    import yaml
except ImportError:
    print("PyYAML is missing: apt-get install python3-yaml")
    sys.exit(1)

SCRAPE_LABELS = {"instance", "job"}
COUNTER_FUNCS = {"rate", "irate", "increase", "resets"}
AGGREGATORS = {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
               "bottomk", "topk", "quantile"}
GROUPING = {"by", "without", "on", "ignoring", "group_left", "group_right"}
KEYWORDS = {"and", "or", "unless", "bool", "offset", "atan2"} | GROUPING
# The modes the daemon is started with: every value retryd_mode{mode} takes.
MODES = ("enforce", "shadow", "disabled", "forced-open")
# The families of the daemon's fleet (docs/FLEET.md): each must have a dashboard panel.
FLEET_PREFIX = "retryd_fleet_"
# A histogram family's series (retryd_call_duration_seconds_bucket, ..._sum, ..._count).
HISTOGRAM_SERIES = ("bucket", "sum", "count")


# --- The real metrics ----------------------------------------------------------------------

class Exported:
    """What one exposition text holds: families with their type, labels and label values."""

    def __init__(self, text):
        self.types = {}   # family -> counter / gauge / ...
        self.labels = {}  # family -> {label: set(values)}
        sample = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
        pair = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:\\.|[^"\\])*)"')
        for line in text.splitlines():
            if line.startswith("# TYPE "):
                _, _, name, kind = line.split(" ", 3)
                self.types[name] = kind
                self.labels.setdefault(name, {})
            elif line and not line.startswith("#"):
                m = sample.match(line)
                if not m:
                    raise ValueError(f"unparsable sample line: {line!r}")
                name = m.group(1)
                base, _, suffix = name.rpartition("_")
                if (name not in self.types and suffix in HISTOGRAM_SERIES
                        and self.types.get(base) == "histogram"):
                    # A histogram's series count up, as counters do (rate() of _bucket).
                    self.types[name] = "counter"
                    self.labels.setdefault(name, {})
                if name not in self.types:
                    raise ValueError(f"sample before its # TYPE: {line!r}")
                for k, v in pair.findall(m.group(2) or ""):
                    self.labels[name].setdefault(k, set()).add(v)

    def all_labels(self):
        out = set(SCRAPE_LABELS)
        for labels in self.labels.values():
            out |= set(labels)
        return out


def real_metrics(retryd, retryctl):
    """Runs the daemon, returns (retryctl metrics text, textfile text)."""
    segment = f"retryd-monitoring-{os.getpid()}"
    with tempfile.TemporaryDirectory(prefix="retryd-monitoring-") as tmp:
        textfile = os.path.join(tmp, "retryd.prom")
        config = os.path.join(tmp, "retryd.toml")
        deps = "".join(f'\n[dependency."dep-{m}"]\nmode = "{m}"\nbulkhead_limit = 4\n'
                       for m in MODES)
        with open(config, "w") as f:
            f.write(f'[daemon]\nsegment = "{segment}"\nsocket = ""\nmax_dependencies = 16\n'
                    f'max_processes = 8\nmetrics_textfile = "{textfile}"\n'
                    f'metrics_interval = "100ms"\n{deps}')
        log = open(os.path.join(tmp, "retryd.log"), "w+")
        env = dict(os.environ)
        for k in ("RETRYD_SOCKET", "RETRYD_SEGMENT", "NOTIFY_SOCKET", "LISTEN_FDS", "LISTEN_PID"):
            env.pop(k, None)
        daemon = subprocess.Popen([retryd, f"--config={config}"], stdout=log, stderr=log,
                                  env=env)
        try:
            text = None
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                if daemon.poll() is not None:
                    break
                r = subprocess.run([retryctl, "--segment", segment, "metrics"], env=env,
                                   capture_output=True, text=True)
                if (r.returncode == 0 and re.search(r"^retryd_daemon_pid [1-9]", r.stdout, re.M)
                        and os.path.exists(textfile)):
                    text = r.stdout
                    break
                time.sleep(0.1)
            if text is None:
                log.seek(0)
                raise RuntimeError(f"the daemon did not come up (exit {daemon.poll()}); its log:\n"
                                   + log.read())
            with open(textfile) as f:
                file_text = f.read()
            return text, file_text
        finally:
            if daemon.poll() is None:
                daemon.send_signal(signal.SIGTERM)
                try:
                    daemon.wait(10)
                except subprocess.TimeoutExpired:
                    daemon.kill()
                    daemon.wait()
            try:
                os.unlink(f"/dev/shm/{segment}")
            except FileNotFoundError:
                pass
            log.close()


# --- PromQL, as far as names go ------------------------------------------------------------

TOKEN = re.compile(r"""
  (?P<ws>\s+)
| (?P<str>"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|`[^`]*`)
| (?P<range>\[[^\]]*\])
| (?P<dur>\d+(?:ms|[smhdwy])(?:\d+(?:ms|[smhdwy]))*(?![A-Za-z0-9_]))
| (?P<num>0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
| (?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)
| (?P<op>=~|!~|!=|==|<=|>=|[-+*/%^<>=,(){}@])
""", re.X)

GRAFANA_VARS = [(re.compile(r"\$__(rate_interval|interval|range)\b|\$\{__(rate_interval|interval|range)\}"), "5m")]


def tokenize(expr):
    pos, out = 0, []
    while pos < len(expr):
        m = TOKEN.match(expr, pos)
        if not m:
            raise ValueError(f"cannot read PromQL at {expr[pos:pos + 20]!r}")
        pos = m.end()
        if m.lastgroup != "ws":
            out.append((m.lastgroup, m.group()))
    return out


def unquote(s):
    return s[1:-1].encode().decode("unicode_escape") if s[0] != "`" else s[1:-1]


class Use:
    """One metric selector in an expression."""

    def __init__(self, name, matchers, func):
        self.name, self.matchers, self.func = name, matchers, func


def parse(expr):
    """Returns (selectors, grouping labels) of a PromQL expression."""
    toks = tokenize(expr)
    uses, grouping = [], set()
    stack = []  # the function (or None) of each open parenthesis
    i = 0

    def label_list(j):  # toks[j] is "(": returns the labels and the index after ")"
        names = []
        j += 1
        while toks[j][1] != ")":
            if toks[j][0] == "ident":
                names.append(toks[j][1])
            j += 1
        return names, j + 1

    def matchers(j):  # toks[j] is "{": returns [(label, op, value)] and the index after "}"
        out = []
        j += 1
        while toks[j][1] != "}":
            if toks[j][1] == ",":
                j += 1
                continue
            label, op, value = toks[j][1], toks[j + 1][1], toks[j + 2]
            if value[0] != "str" or op not in ("=", "!=", "=~", "!~"):
                raise ValueError(f"bad matcher near {label!r} in {expr!r}")
            out.append((label, op, unquote(value[1])))
            j += 3
        return out, j + 1

    while i < len(toks):
        kind, text = toks[i]
        nxt = toks[i + 1][1] if i + 1 < len(toks) else None
        if kind == "ident" and text in GROUPING:
            if nxt == "(":
                names, i = label_list(i + 1)
                grouping.update(names)
            else:
                i += 1
            continue
        if kind == "ident" and text in KEYWORDS:
            i += 2 if text == "offset" else 1
            continue
        if kind == "ident" and text in AGGREGATORS and nxt in ("(", "by", "without"):
            j = i + 1
            if nxt in ("by", "without"):
                names, j = label_list(i + 2)
                grouping.update(names)
            stack.append(text)
            i = j + 1  # past "("
            continue
        if kind == "ident" and nxt == "(":
            stack.append(text)
            i += 2
            continue
        if kind == "ident":
            ms = []
            j = i + 1
            if nxt == "{":
                ms, j = matchers(i + 1)
            func = next((f for f in reversed(stack) if f is not None), None)
            uses.append(Use(text, ms, func))
            i = j
            continue
        if text == "{":
            raise ValueError(f"a selector without a metric name in {expr!r}")
        if text == "(":
            stack.append(None)
        elif text == ")":
            if not stack:
                raise ValueError(f"unbalanced ) in {expr!r}")
            stack.pop()
        i += 1
    if stack:
        raise ValueError(f"unbalanced ( in {expr!r}")
    return uses, grouping


def grafana_to_promql(expr):
    for pat, rep in GRAFANA_VARS:
        expr = pat.sub(rep, expr)
    # Any other $var lives in a label value string, or is an error found by the lexer.
    return expr


def check_expr(where, expr, real, problems):
    try:
        uses, grouping = parse(expr)
    except (ValueError, IndexError) as e:
        problems.append(f"{where}: cannot parse: {e}: {expr!r}")
        return set()
    known = real.all_labels()
    for label in grouping - known:
        problems.append(f"{where}: no retryd metric has label {label!r} (grouping): {expr!r}")
    names = set()
    for u in uses:
        names.add(u.name)
        if u.name not in real.types:
            problems.append(f"{where}: metric {u.name!r} is not in `retryctl metrics`: {expr!r}")
            continue
        kind = real.types[u.name]
        if kind == "histogram":
            problems.append(f"{where}: {u.name} is a histogram family, whose series are "
                            f"{u.name}_bucket, _sum and _count: {expr!r}")
            continue
        inner = u.func in COUNTER_FUNCS
        if kind == "counter" and not inner:
            problems.append(f"{where}: counter {u.name} used without rate()/increase(): {expr!r}")
        if kind != "counter" and inner:
            problems.append(f"{where}: {kind} {u.name} inside {u.func}(): {expr!r}")
        labels = real.labels[u.name]
        for label, op, value in u.matchers:
            if label in SCRAPE_LABELS:
                continue
            if label not in labels:
                problems.append(f"{where}: {u.name} has no label {label!r}: {expr!r}")
                continue
            if "$" in value:
                continue  # a Grafana variable
            if op in ("=", "!="):
                wanted = [value]
            elif re.fullmatch(r"[A-Za-z0-9_.:-]+(\|[A-Za-z0-9_.:-]+)*", value):
                wanted = value.split("|")
            else:
                wanted = []  # a real regex: not checked word by word
            for w in wanted:
                if w not in labels[label]:
                    problems.append(f"{where}: {u.name}{{{label}}} never takes the value {w!r} "
                                    f"(real: {sorted(labels[label])}): {expr!r}")
    return names


# --- The files -----------------------------------------------------------------------------

def rules_exprs(path):
    with open(path) as f:
        doc = yaml.safe_load(f)
    for group in doc["groups"]:
        for rule in group["rules"]:
            name = rule.get("alert") or rule.get("record")
            yield f"{os.path.basename(path)}: {name}", rule["expr"]


def check_rule_tests(rules_path, tests_path, problems):
    """Every alert has a test case where it fires and one where it must not, and every case
    names an alert of the rules."""
    with open(rules_path) as f:
        rules = yaml.safe_load(f)
    with open(tests_path) as f:
        tests = yaml.safe_load(f)
    alerts = [r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r]
    fires, quiet = set(), set()
    base = os.path.basename(tests_path)
    for test in tests["tests"]:
        for case in test.get("alert_rule_test", []):
            name = case["alertname"]
            if name not in alerts:
                problems.append(f"{base}: {test.get('name', '?')}: no alert {name!r} in "
                                f"{os.path.basename(rules_path)}")
            (fires if case.get("exp_alerts") else quiet).add(name)
    for name in alerts:
        if name not in fires:
            problems.append(f"{base}: no case where {name} fires")
        if name not in quiet:
            problems.append(f"{base}: no case where {name} must not fire (exp_alerts: [])")


def test_series(path):
    with open(path) as f:
        doc = yaml.safe_load(f)
    for test in doc["tests"]:
        for s in test.get("input_series", []):
            yield f"{os.path.basename(path)}: {test.get('name', '?')}", s["series"]


def walk_panels(panels):
    for p in panels:
        yield p
        yield from walk_panels(p.get("panels", []))


def dashboard_exprs(path, problems):
    with open(path) as f:
        dash = json.load(f)
    base = os.path.basename(path)
    if not isinstance(dash.get("schemaVersion"), int) or dash["schemaVersion"] < 36:
        problems.append(f"{base}: schemaVersion {dash.get('schemaVersion')!r}, want >= 36")
    variables = {v["name"]: v for v in dash.get("templating", {}).get("list", [])}
    ds = [v for v in variables.values() if v.get("type") == "datasource"]
    if not ds or ds[0].get("query") != "prometheus":
        problems.append(f"{base}: no Prometheus datasource template variable")
    ds_ref = "${%s}" % ds[0]["name"] if ds else None
    if "instance" not in variables or variables["instance"].get("type") != "query":
        problems.append(f"{base}: no `instance` query variable")
    for name, v in variables.items():
        if v.get("type") != "query":
            continue
        if v.get("datasource", {}).get("uid") != ds_ref:
            problems.append(f"{base}: variable {name} is not on the datasource variable")
        q = v.get("query")
        q = q.get("query", "") if isinstance(q, dict) else q
        m = re.fullmatch(r"\s*label_values\((.*),\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)\s*", q or "")
        if not m:
            problems.append(f"{base}: variable {name}: not a label_values(SELECTOR, LABEL) "
                            f"query: {q!r}")
            continue
        yield f"{base}: variable {name}", m.group(1), m.group(2)
    count = 0
    for p in walk_panels(dash.get("panels", [])):
        if p.get("type") == "row":
            continue
        title = p.get("title", "?")
        if p.get("datasource", {}).get("uid") != ds_ref:
            problems.append(f"{base}: panel {title!r} is not on the datasource variable")
        if not p.get("targets"):
            problems.append(f"{base}: panel {title!r} has no query")
        for t in p.get("targets", []):
            if t.get("datasource", {}).get("uid") != ds_ref:
                problems.append(f"{base}: panel {title!r} target {t.get('refId')} is not on the "
                                "datasource variable")
            count += 1
            yield f"{base}: panel {title!r} {t.get('refId')}", t["expr"], None
    if count == 0:
        problems.append(f"{base}: no panel queries found")


def promtool_parse(promtool, exprs, problems):
    """Has promtool parse the dashboard's expressions, as recording rules."""
    rules = [{"record": f"dashboard:expr_{i}", "expr": e} for i, (_, e) in enumerate(exprs)]
    with tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False) as f:
        yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}, f)
        path = f.name
    try:
        r = subprocess.run([promtool, "check", "rules", path], capture_output=True, text=True)
        if r.returncode != 0:
            problems.append("promtool rejects a dashboard expression:\n" + r.stdout + r.stderr)
    finally:
        os.unlink(path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--retryd", required=True)
    ap.add_argument("--retryctl", required=True)
    ap.add_argument("--rules", required=True)
    ap.add_argument("--dashboard", required=True)
    ap.add_argument("--rule-tests")
    ap.add_argument("--promtool", required=True)
    args = ap.parse_args()
    if not (os.path.isfile(args.promtool) and os.access(args.promtool, os.X_OK)):
        print(f"promtool not found ({args.promtool!r}): install Debian's package prometheus "
              "(apt-get install prometheus; scripts/test does), then re-run cmake")
        return 1

    text, file_text = real_metrics(args.retryd, args.retryctl)
    real = Exported(text)
    problems = []
    from_file = Exported(file_text)
    if set(from_file.types) != set(real.types):
        problems.append("the textfile and `retryctl metrics` export different families: "
                        f"{sorted(set(from_file.types) ^ set(real.types))}")
    # The daemon must really have started with every mode, or the mode checks prove nothing.
    modes = real.labels.get("retryd_mode", {}).get("mode", set())
    if modes != set(MODES):
        problems.append(f"the daemon exported modes {sorted(modes)}, want {sorted(MODES)}")

    used = set()
    for where, expr in rules_exprs(args.rules):
        used |= check_expr(where, expr, real, problems)
    dash_exprs = []
    dash_used = set()
    for where, expr, label in dashboard_exprs(args.dashboard, problems):
        promql = grafana_to_promql(expr)
        names = check_expr(where, promql, real, problems)
        used |= names
        dash_used |= names
        if label is not None:
            uses, _ = parse(promql)
            for u in uses:
                if u.name in real.labels and label not in real.labels[u.name] \
                        and label not in SCRAPE_LABELS:
                    problems.append(f"{where}: {u.name} has no label {label!r}")
        else:
            dash_exprs.append((where, re.sub(r"\$\{?[A-Za-z_]+\}?", "x", promql)))
    if args.rule_tests:
        check_rule_tests(args.rules, args.rule_tests, problems)
        for where, series in test_series(args.rule_tests):
            m = re.fullmatch(r"\s*([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s*", series)
            if not m:
                problems.append(f"{where}: cannot read series {series!r}")
                continue
            # A series is a selector with = matchers: the same checks, as a gauge or counter
            # read as the alert reads it (type checks do not apply).
            name = m.group(1)
            if name not in real.types:
                problems.append(f"{where}: series {name!r} is not in `retryctl metrics`")
                continue
            for label, value in re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:\\.|[^"\\])*)"',
                                           m.group(2) or ""):
                if label in SCRAPE_LABELS:
                    continue
                labels = real.labels[name]
                if label not in labels:
                    problems.append(f"{where}: series {name} has no label {label!r}")
                elif label != "dependency" and value not in labels[label]:
                    problems.append(f"{where}: series {name}{{{label}}} never takes {value!r}")
    promtool_parse(args.promtool, dash_exprs, problems)
    # Every family of the fleet has a panel: one the daemon adds without a panel fails here.
    for family in sorted(real.types):
        if family.startswith(FLEET_PREFIX) and family not in dash_used:
            problems.append(f"{os.path.basename(args.dashboard)}: no panel shows {family}")
    # So has every histogram, by its buckets (a quantile or a heatmap).
    for family, kind in sorted(real.types.items()):
        if kind == "histogram" and f"{family}_bucket" not in dash_used:
            problems.append(f"{os.path.basename(args.dashboard)}: no panel shows {family}_bucket")

    print(f"real output: {len(real.types)} families; the monitoring files use {len(used)}:")
    print("  " + " ".join(sorted(used)))
    unused = sorted(set(real.types) - used)
    print(f"not used: {' '.join(unused) if unused else '(none)'}")
    if problems:
        print(f"\n{len(problems)} problem(s):")
        for p in problems:
            print("  " + p)
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
