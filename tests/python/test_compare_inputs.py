"""overflow_sentinel.compare's refusals, each a clear error naming the module before the long runs
(a mapping onto modules that do not exist, shapes no transform reconciles, weights that differ
after mapping, inputs a model rejects), its report forms (verdict line, text, JSON, HTML, what is on
one side only and a suggested mapping), its memory cap and its pre-flight findings."""

import html
import json
import os
import re

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("transformers")

import llama_port as lp  # noqa: E402
from llama_port import one_thread, reference  # noqa: E402,F401 - the fixtures the tests share

import overflow_sentinel  # noqa: E402
from overflow_sentinel.compare import Rule  # noqa: E402


def tokens(seq=16):
    return torch.randint(0, 128, (2, seq), generator=torch.Generator().manual_seed(1))


def run(reference, port, mapping=lp.MAPPING, x=None, **kw):
    x = tokens() if x is None else x
    return overflow_sentinel.compare(reference, port, {"input_ids": x}, mapping, candidate_inputs=(x,),
                                     activation=kw.pop("activation", lp.ACTIVATION), **kw)


class Counting(torch.nn.Module):
    """Counts its forwards: a refusal must come before any run."""

    def __init__(self, model):
        super().__init__()
        self.inner, self.calls = model, 0

    def forward(self, *args, **kwargs):
        self.calls += 1
        return self.inner(*args, **kwargs)


def test_a_rule_matching_no_candidate_module_is_refused_by_name(reference):
    mapping = lp.MAPPING + [Rule(r"model\.layers\.(\d+)\.attn\.qkv", r"model.layers.\1.self_attn.{q,k,v}_proj")]
    with pytest.raises(ValueError, match=r"matches no candidate module .*closest path"):
        run(reference, lp.port_of(reference), mapping)


def test_a_rule_naming_a_reference_module_that_does_not_exist_is_refused_by_name(reference):
    mapping = [Rule(r"model\.layers\.(\d+)\.attention\.qkv", r"model.layers.\1.attn.{q,k,v}_proj")] + lp.MAPPING
    with pytest.raises(ValueError, match=r"onto reference module 'model\.layers\.0\.attn\.q_proj', which does not exist"):
        run(reference, lp.port_of(reference), mapping)


def test_shapes_no_transform_reconciles_are_refused_before_any_run(reference):
    port = Counting(lp.port_of(reference))
    mapping = [Rule(r"inner\.model\.layers\.(\d+)\.attention\.qkv", r"model.layers.\1.self_attn.q_proj")]
    with pytest.raises(ValueError, match=r"shapes no transform reconciles at candidate parameter "
                                         r"'inner\.model\.layers\.0\.attention\.qkv\.weight': \[128, 64\]"):
        run(reference, port, mapping)
    assert port.calls == 0


def test_activations_no_transform_reconciles_are_refused_at_the_first_run(reference):
    # Without the layout transform the port's [seq, batch, hidden] meets transformers' [batch, seq, hidden].
    with pytest.raises(ValueError, match=r"shapes no transform reconciles at model\.embed_tokens <-> "
                                         r"model\.embed_tokens .*\[16, 2, 64\] against the reference's \[2, 16, 64\]"):
        run(reference, lp.port_of(reference), activation=None)


def test_weights_that_differ_after_mapping_are_refused_before_any_run(reference):
    port = Counting(lp.port_of(reference))
    with torch.no_grad():
        port.inner.model.layers[1].mlp.gate_up.weight[70, 3] += 0.5      # a row of up_proj's half
    mapping = [Rule(r"inner\.model\.layers\.(\d+)\.mlp\.gate_up", r"model.layers.\1.mlp.{gate,up}_proj")]
    with pytest.raises(ValueError, match=r"weights differ after mapping at candidate parameter "
                                         r"'inner\.model\.layers\.1\.mlp\.gate_up\.weight' .*1 of 16384 elements"):
        run(reference, port, mapping)
    assert port.calls == 0


def test_inputs_a_model_rejects_are_named_with_the_module(reference):
    bad = tokens()
    bad[0, 3] = 500                     # past the vocabulary
    with pytest.raises(ValueError, match=r"the reference rejects the inputs in module 'model\.embed_tokens': IndexError"):
        run(reference, lp.port_of(reference), x=bad)


def test_the_report_forms(reference, tmp_path):
    bugs = lambda i: ("transposed_o_proj",) if i == 1 else ()  # noqa: E731
    result = run(reference, lp.port_of(reference, bugs), report=str(tmp_path / "c.json"))
    verdict = result.verdict
    assert "\n" not in verdict
    assert re.match(r"diverges: forward at model\.layers\.1\.attention\.o_proj <-> model\.layers\.1\.self_attn\.o_proj: "
                    r"output relative RMSE \S+ > tolerance \S+ while its input \S+ <= \S+; the module alone on the "
                    r"reference's input reproduces it", verdict), verdict
    saved = json.loads((tmp_path / "c.json").read_text())
    assert saved["kind"] == "compare" and saved["verdict"] == verdict and not saved["agree"]
    assert saved["first_divergence"]["candidate"] == "model.layers.1.attention.o_proj"
    first_rows = [r for r in saved["rows"] if r["first"]]
    assert [r["candidate"] for r in first_rows] == ["model.layers.1.attention.o_proj"]
    out = first_rows[0]["forward"]["out"]
    for key in ("max_abs", "max_rel", "rmse", "cosine", "within", "worst", "baseline", "tolerance"):
        assert key in out
    assert out["within"] < 0.5 and set(out["worst"]) == {"index", "candidate", "reference"}
    result.write(tmp_path / "c.html")
    page = (tmp_path / "c.html").read_text()
    assert page.count("class='first'") == 1 and "model.layers.1.self_attn.o_proj" in page
    result.write(tmp_path / "c.txt")
    text = (tmp_path / "c.txt").read_text()
    assert text.splitlines()[0] == verdict
    assert ">>model.layers.1.attention.o_proj" in text
    with pytest.raises(ValueError, match=r"\.json, \.html or \.txt"):
        result.write(tmp_path / "c.csv")


def test_what_is_on_one_side_only_is_listed_with_a_suggested_mapping(reference):
    # Without its rule the fused QKV has no counterpart: compared at the enclosing attention.
    mapping = [r for r in lp.MAPPING if "qkv" not in r.candidate]
    result = run(reference, lp.port_of(reference), mapping)
    assert result.agree
    assert "model.layers.0.attention.qkv" in result.only_candidate
    assert "model.layers.0.self_attn.q_proj" in result.only_reference
    # The fused module's weight is its reference siblings' stacked: the suggestion is the rule.
    suggested = r"Rule(r'model\.layers\.(\d+)\.attention\.qkv', r'model.layers.\1.self_attn.{q_proj,k_proj,v_proj}')"
    assert result.suggestions == [suggested]
    again = run(reference, lp.port_of(reference), mapping + [eval(suggested)])
    assert again.agree and "model.layers.0.attention.qkv" in {r["candidate"] for r in again.rows}


def test_the_float64_references_tensors_spill_to_disk_past_the_cap(reference):
    bugs = lambda i: ("transposed_o_proj",) if i == 1 else ()  # noqa: E731
    in_memory = run(reference, lp.port_of(reference, bugs))
    spilled = run(reference, lp.port_of(reference, bugs), memory_cap_bytes=64 * 1024)
    assert in_memory.memory["bytes_spilled"] == 0
    assert spilled.memory["bytes_spilled"] > 0 and spilled.memory["peak_bytes_in_memory"] <= 64 * 1024
    assert spilled.verdict == in_memory.verdict


def test_preflight_turns_dropout_off_and_names_it(reference):
    port = lp.port_of(reference)
    port.model.layers[0].mlp.down_proj = torch.nn.Sequential(port.model.layers[0].mlp.down_proj, torch.nn.Dropout(0.5))
    port.train()
    result = run(reference, port)
    assert result.agree, result.text
    assert any(f.startswith("dropout: the candidate was in training mode") for f in result.findings)
    assert port.training                        # restored afterwards
    assert not torch.are_deterministic_algorithms_enabled()


def test_preflight_names_a_candidate_that_does_not_repeat_itself(reference):
    port = lp.port_of(reference)
    calls = []

    def stateful(module, args, out):         # a state that changes per call, as a running statistic does
        calls.append(1)
        return out + 1e-3 * len(calls)
    port.model.norm.register_forward_hook(stateful)
    result = run(reference, port, backward=False)
    assert any(f.startswith("repeatability: the candidate gave another output") for f in result.findings)


def test_sentinel_report_renders_a_compares_json(reference, tmp_path):
    import pathlib
    import subprocess
    cli = pathlib.Path(overflow_sentinel.__file__).resolve().parents[2] / "sentinel"
    if not cli.exists():
        pytest.skip(f"the sentinel tool is not built beside the module ({cli})")
    bugs = lambda i: ("detached_residual",) if i == 1 else ()  # noqa: E731
    result = run(reference, lp.port_of(reference, bugs), report=str(tmp_path / "c.json"))
    shown = subprocess.run([str(cli), "report", str(tmp_path / "c.json"), "--text", "--html", str(tmp_path / "c.html")],
                           capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0] == result.verdict
    assert lines[0].startswith("diverges: backward at model.layers.1 <-> model.layers.1: input gradient")
    assert [line.split()[0] for line in lines if line.startswith(">>")] == [">>model.layers.1"]
    assert "reference only: model.layers.0.mlp.act_fn" in shown.stdout
    page = (tmp_path / "c.html").read_text()
    assert page.count('class="first"') == 1 and html.escape(result.verdict, quote=False) in page
    # A compare's JSON with a key missing is named by the key.
    saved = json.loads((tmp_path / "c.json").read_text())
    del saved["rows"][2]["matched_by"]
    (tmp_path / "bad.json").write_text(json.dumps(saved))
    bad = subprocess.run([str(cli), "report", str(tmp_path / "bad.json")], capture_output=True, text=True)
    assert bad.returncode == 4 and "rows[2].matched_by: missing" in bad.stderr, bad.stderr
    saved = json.loads((tmp_path / "c.json").read_text())
    saved["rows"][1]["call"] = "first"
    (tmp_path / "bad.json").write_text(json.dumps(saved))
    bad = subprocess.run([str(cli), "report", str(tmp_path / "bad.json")], capture_output=True, text=True)
    assert bad.returncode == 4 and "rows[1].call: expected an integer" in bad.stderr, bad.stderr
