"""bench/harness without a network: the result schema (every file records its command, commit, machine and
link, and a file without them is refused by name), the WAN's realistic defaults (TCP cubic, MTU by rate,
names from the engineer's cluster), the tables rendered from result files, and the RTT experiment's step
arithmetic and method parsing."""
import json
import subprocess
import sys

import pytest

from bench.experiments import wan_rtt
from bench.harness import results, tables
from bench.harness.wan import WanSpec, default_name, default_subnet


def test_results_record_command_commit_machine_and_link(tmp_path):
    path = tmp_path / "r.json"
    results.write(path, {"x": 1}, link={"1gbit": {"rate": "1gbit"}})
    data = results.load(path, require=True)
    prov = data["provenance"]
    assert data["x"] == 1 and results.missing(data) == []
    assert prov["schema"] == results.SCHEMA and prov["link"] == {"1gbit": {"rate": "1gbit"}}
    assert "pytest" in prov["command"] or "python" in prov["command"]
    assert prov["commit"] != "" and prov["machine"]["cores"] >= 1
    results.write(path, {"x": 2}, link="100mbit")  # a rewrite keeps one provenance, the new link
    again = results.load(path, require=True)
    assert again["x"] == 2 and again["provenance"]["link"] == "100mbit"
    assert again["provenance"]["command"] == prov["command"]


def test_a_result_without_provenance_is_refused_by_name(tmp_path):
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"networks": {}}))
    assert results.load(path) == {"networks": {}}  # older files still read
    with pytest.raises(ValueError, match="no provenance schema, command, commit, machine, link"):
        results.load(path, require=True)
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match="a result file holds a JSON object, not list"):
        results.load(path)


def test_the_command_line_is_the_module_as_typed():
    out = subprocess.run([sys.executable, "-c", "from bench.harness import results; print(results.command_line())",
                          "--flag", "a b"], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "python -c 'from bench.harness import results; print(results.command_line())' --flag 'a b'"


def test_wan_defaults_are_cubic_and_mtu_by_rate(monkeypatch):
    spec = WanSpec(hosts=2, rate="1gbit", delay="25ms")
    assert spec.cc == "cubic" and spec.host_sysctls()[0] == "net.ipv4.tcp_congestion_control=cubic"
    assert [WanSpec(hosts=2, rate=r, delay="1ms").link_mtu() for r in ("100mbit", "999mbit", "1gbit", "10gbit")] \
        == [1500, 1500, 9000, 9000]
    assert WanSpec(hosts=2, rate="1gbit", delay="1ms", cc="").host_sysctls() == []
    with pytest.raises(ValueError, match="bad congestion control 'cu bic'"):
        WanSpec(hosts=2, rate="1gbit", delay="1ms", cc="cu bic").validate()
    monkeypatch.delenv("GX_WAN_NAME", raising=False)
    monkeypatch.delenv("GX_WAN_SUBNET", raising=False)
    monkeypatch.setenv("GX_CLUSTER_NAME", "gxb")
    monkeypatch.setenv("GX_CLUSTER_SUBNET", "198.18.20")
    assert (default_name(), default_subnet()) == ("gxbw", "198.19.20")
    assert WanSpec(hosts=2, rate="1gbit", delay="1ms").name == "gxbw"
    monkeypatch.setenv("GX_CLUSTER_NAME", "gx")
    monkeypatch.setenv("GX_CLUSTER_SUBNET", "10.0.0")
    assert (default_name(), default_subnet()) == ("gxw", "198.19.0")


def test_rtt_rates_and_methods():
    step_s = [1.0] * 3 + [0.5] * 6  # a slow start, then 2 steps/s
    r = wan_rtt.rates(step_s)
    assert r["steps_per_s"] == pytest.approx(9 / 6.0) and r["steady_steps_per_s"] == pytest.approx(2.0)
    assert r["first10_s"] is None
    assert wan_rtt.parse_method("gradex_default+GRADEX_DELAY=1") == ("gradex_default", {"GRADEX_DELAY": "1"})
    with pytest.raises(ValueError, match="unknown method 'gloo'"):
        wan_rtt.parse_method("gloo")
    with pytest.raises(ValueError, match="bad method setting 'X'"):
        wan_rtt.parse_method("ddp+X")


SWEEP = {"task": "mlp", "hosts": 4, "rate": "1gbit", "steps": 30, "methods": ["nocomm", "ddp", "gradex_default"],
         "delays": {"25ms": {"rtt_ms": 50.0, "methods": {"ddp": {"steady_steps_per_s": 1.0},
                                                          "gradex_default": {"steady_steps_per_s": 4.0}}},
                    "0.5ms": {"rtt_ms": 1.0, "methods": {"nocomm": {"steady_steps_per_s": 20.0},
                                                         "ddp": {"steady_steps_per_s": 2.0},
                                                         "gradex_default": {"steady_steps_per_s": 10.0}}}}}


def test_rtt_table_and_figure(tmp_path):
    lines = tables.rtt(SWEEP)
    assert lines[0] == "| RTT, ms | `ddp` | `gradex_default` | `gradex_default` ÷ DDP | `gradex_default` ÷ bound |"
    assert lines[2] == "| 1 | 2.00 | 10.00 | 5.00 | 0.50 |" and lines[3] == "| 50 | 1.00 | 4.00 | 4.00 | 0.20 |"
    assert lines[-1] == "Compute bound (`nocomm`, no communication): 20.00 steps/s."
    png = tmp_path / "rtt.png"
    assert wan_rtt.draw(SWEEP, SWEEP["methods"], str(png)) == str(png) and png.stat().st_size > 10_000


def test_race_summary_table():
    method = lambda ttt, steps, sps: {"summary": {"time_to_target_s": {"median": ttt},  # noqa: E731
                                                  "steps_to_target": {"median": steps},
                                                  "steps_per_s": {"median": sps}}}
    train = {"reference": "1gbit", "networks": {"1gbit": {"tasks": {"mlp": {"target": 0.72, "methods": {
        "ddp": method(50.0, 180, 3.5), "gradex_auto": method(20.0, 170, 8.9)}}}}}}
    lines = tables.race_summary(train)
    assert lines[0] == "| task (target) | `ddp` | `gradex_auto` | DDP ÷ `gradex_auto` |"
    assert lines[2] == "| mlp (0.72) | 50.0 s (180; 3.50) | 20.0 s (170; 8.90) | 2.50 |"
