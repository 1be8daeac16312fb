"""The claims catalogue is data (claims_catalogue.yaml): every entry is checked when read, the
paper's number is read from the printed text, and a new claim needs only a catalogue entry."""

from __future__ import annotations

import pytest
import yaml

from repro.figures import claims
from repro.figures.claims_catalogue import CATALOGUE_FILE, CatalogueError, load_catalogue, make_claim, paper_number
from repro.figures.claims_verdict import pct, times
from repro.figures.style import BASELINES

ENTRY = {"id": "toy.ratio", "artefact": "fig2_main", "statement": "LBGR+RLT vs Random+LRU, P50 latency",
         "paper": "30.9×", "rule": "mean_ratio", "base": "Random+LRU", "ours": "LBGR+RLT", "metric": "latency_p50_s"}


def _closure(claim) -> dict:
    f = claim.evaluate
    return dict(zip(f.__code__.co_freevars, (c.cell_contents for c in f.__closure__ or ())))


def test_committed_catalogue_loads_in_table_order():
    raw = yaml.safe_load(CATALOGUE_FILE.read_text())["claims"]
    assert [c.id for c in claims.CLAIMS] == [e["id"] for e in raw]
    assert len(claims.CLAIMS) == len({c.id for c in claims.CLAIMS}) == 50
    assert {c.rule for c in claims.CLAIMS} == set(claims.RULES)  # every rule is used


@pytest.mark.parametrize("text, kind_args", [
    ("11.96×", {"paper": 11.96, "fmt": times}),
    ("6.40×", {"paper": 6.4, "fmt": times}),
    ("+36.45 %", {"paper": 0.3645, "fmt": pct}),
    ("+36.51 %", {"paper": 0.3651, "fmt": pct}),
])
def test_paper_number_is_read_exactly_from_the_printed_text(text, kind_args):
    c = make_claim({**ENTRY, "paper": text})
    got = _closure(c)
    assert got["paper"] == kind_args["paper"]  # exact float equality: as if written as a literal
    assert got["fmt"] is kind_args["fmt"]


def test_reduction_and_overhead_numbers():
    red = make_claim({"id": "t.r", "artefact": "tab2_ablation", "statement": "s", "paper": "−44.87 %",
                      "rule": "reduction", "base": "CacheAware+LRU", "ours": "LBGR+LRU", "metric": "ttft_p50_s"})
    assert _closure(red)["paper"] == 0.4487
    ovh = make_claim({"id": "t.o", "artefact": "tab2_ablation", "statement": "s", "paper": "+0.58 ms",
                      "rule": "added_overhead", "column": "eviction_ms_per_query", "base": "CacheAware+LRU",
                      "ours": "CacheAware+RLT"})
    assert _closure(ovh)["paper_ms"] == 0.58
    assert paper_number("−38 %") == (-1, paper_number("38 %")[1], "%")


def test_group_names_resolve():
    c = make_claim({"id": "t.g", "artefact": "fig6_workers", "statement": "s", "paper": "qualitative", "rule": "lowest",
                    "system": "LBGR+RLT", "metrics": ["hit_rate"], "against": "baselines"})
    assert _closure(c)["against"] == BASELINES


@pytest.mark.parametrize("change, message", [
    ({"rule": "fastest"}, "rule 'fastest' unknown"),
    ({"basis": "Random+LRU"}, "unexpected keyword argument 'basis'"),
    ({"metric": "latency_p99_s"}, "unknown metric"),
    ({"base": "Random+FIFO"}, "not among the paper's systems"),
    ({"paper": "about 30×"}, "no number in"),
    ({"paper": "−30 %", "rule": "added_overhead", "column": "eviction_ms_per_query", "metric": None},
     "not a ms number"),
    ({"artefact": "fig99"}, "not a figure/table"),
    ({"statement": None}, "missing statement"),
])
def test_bad_entries_are_rejected_naming_the_claim(change, message):
    entry = {k: v for k, v in {**ENTRY, **change}.items() if v is not None}
    from repro.figures import ARTEFACTS

    with pytest.raises(CatalogueError, match="toy.ratio") as exc:
        make_claim(entry, ARTEFACTS)
    assert message in str(exc.value)


def test_missing_rule_parameter_is_rejected():
    entry = {k: v for k, v in ENTRY.items() if k != "ours"}
    with pytest.raises(CatalogueError, match="missing a required argument: 'ours'"):
        make_claim(entry)


def test_duplicate_ids_are_rejected(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump({"claims": [ENTRY, ENTRY]}, allow_unicode=True))
    with pytest.raises(CatalogueError, match="duplicate claim ids"):
        load_catalogue(p)


def test_a_new_claim_is_one_catalogue_entry(fixture_results):
    """A claim that is only data: evaluated like the committed ones, and the same rule and
    parameters give the same row as the committed claim they copy."""
    toy = make_claim(ENTRY)
    t = claims.evaluate(fixture_results, [toy, next(c for c in claims.CLAIMS if c.id == "fig2.p50_latency_vs_random")])
    assert list(t["id"]) == ["toy.ratio", "fig2.p50_latency_vs_random"]
    assert t.iloc[0]["ours"] == t.iloc[1]["ours"] and t.iloc[0]["verdict"] == t.iloc[1]["verdict"]
