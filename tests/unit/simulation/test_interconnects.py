"""Links between tensor-parallel GPUs as parts of their own (kvbudget.interconnects, data/interconnects.json): the
kinds parse and refuse, each card defaults to the best link it has, an all-reduce's time is latency + ring traffic
over the bus bandwidth, and the held-out served runs record the link their logs show."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import kvbudget
from kvbudget.choices import Interconnect
from kvbudget.gpus import find_gpu
from kvbudget.simulation import setup_for

SERVED = Path(__file__).resolve().parents[3] / "benchmarks" / "data" / "served" / "runs.json"


def test_the_link_kinds_parse_and_a_wrong_one_is_refused_naming_them():
    assert Interconnect.parse("pcie-no-p2p", "interconnect") is Interconnect.PCIE_NO_P2P
    assert [k.across_nodes for k in Interconnect] == [False, False, False, True, True]
    with pytest.raises(kvbudget.KVBudgetError) as e:
        Interconnect.parse("nvswitch", "interconnect")
    assert str(e.value) == "interconnect: 'nvswitch' is not one of nvlink, pcie, pcie-no-p2p, ethernet, infiniband"
    assert e.value.param == "interconnect"


def test_an_sxm_card_defaults_to_nvlink_and_pcie_cards_do_not():
    for name in ("A100-80GB", "A100-40GB", "H100-80GB", "H200", "B200"):
        assert find_gpu(name).link is Interconnect.NVLINK, name
    for name in ("A100-80GB-PCIe", "L40S", "RTX-PRO-6000", "L4"):
        assert find_gpu(name).link is Interconnect.PCIE, name
    # GeForce cards get no peer-to-peer access over PCIe from NVIDIA's driver
    assert find_gpu("RTX-4090").link is Interconnect.PCIE_NO_P2P
    # an A100 PCIe card may have the NVLink bridge (600 GB/s both ways); an L40S has no NVLink at all
    assert Interconnect.NVLINK in find_gpu("A100-80GB-PCIe").links
    assert find_gpu("A100-80GB-PCIe").nvlink_bytes_per_s == 600e9
    assert Interconnect.NVLINK not in find_gpu("L40S").links


def test_the_basis_names_the_link_and_a_link_the_card_lacks_is_refused_before_planning():
    qwen = kvbudget.load_model("qwen2-7b")
    measured = setup_for(qwen, gpu="A100-80GB", tp=2, max_model_len=4096).time_model
    assert measured.basis.split("; host costs ")[0].endswith("; all-reduce measured over nvlink")  # (test_vllm_host)
    geforce = setup_for(qwen, gpu="RTX-4090", tp=2, max_model_len=4096).time_model
    assert "; all-reduce over pcie-no-p2p: 12.0 us + 8.0 GB/s bus bandwidth" in geforce.basis
    assert geforce.basis.split("; host costs ")[0].endswith("(estimate)")
    with pytest.raises(kvbudget.KVBudgetError, match=r"^interconnect nvlink: the L40S has no NVLink; choose pcie, "
                       r"pcie-no-p2p, ethernet, infiniband$") as e:
        setup_for(qwen, gpu="L40S", tp=2, max_model_len=4096, interconnect="nvlink")
    assert e.value.param == "interconnect"
    with pytest.raises(kvbudget.KVBudgetError, match="^interconnect: goes with gpu"):
        setup_for(qwen, kv_memory=8 << 30, tp=2, max_model_len=4096, interconnect="pcie")


def test_tp2_without_peer_to_peer_is_slower_than_over_nvlink_by_the_formula():
    """Qwen2-7B (28 layers, hidden 3,584) at TP 2 on A100 PCIe cards, 32 sequences decoding: two all-reduces a
    layer of 32 x 3,584 bf16 values, 229,376 bytes. Over the NVLink bridge (600 GB/s both ways, 300 one way, 0.8 of
    it the bus: 240 GB/s; vLLM's custom kernel, 4.9 us) and without peer-to-peer (NCCL through host memory: 12.0 us,
    0.25 of PCIe 4.0 x16's 32 GB/s one way: 8 GB/s); a ring of two moves 2 (2 - 1) / 2 = 1 message per GPU."""
    qwen = kvbudget.load_model("qwen2-7b")
    nvlink = setup_for(qwen, gpu="A100-80GB-PCIe", tp=2, max_model_len=4096, interconnect="nvlink").time_model
    host = setup_for(qwen, gpu="A100-80GB-PCIe", tp=2, max_model_len=4096, interconnect="pcie-no-p2p").time_model
    message = 32 * 3584 * 2
    per_call = (12.0e-6 + message / 8e9) - (4.9e-6 + message / 240e9)
    by_hand = 2 * 28 * per_call
    assert by_hand == pytest.approx(1.9497e-3, rel=1e-4)
    slower = host.step_seconds(32, 32 * 1025) - nvlink.step_seconds(32, 32 * 1025)
    assert slower == pytest.approx(by_hand, rel=1e-9)
    # at TP 4 the ring moves 2 x 3 / 4 = 1.5 messages per GPU, and NCCL's latency over PCIe replaces the custom
    # kernel's (vLLM runs it over PCIe at TP 2 only): 24.6 us, 0.63 x 32 GB/s
    llama = kvbudget.load_model("llama-3.1-8b")  # 32 layers, hidden 4,096
    tp4 = setup_for(llama, gpu="A100-80GB-PCIe", tp=4, max_model_len=4096).time_model
    tp4_host = setup_for(llama, gpu="A100-80GB-PCIe", tp=4, max_model_len=4096,
                         interconnect="pcie-no-p2p").time_model
    message = 4096 * 2
    one = (24.6e-6 + 1.5 * message / (0.63 * 32e9)) - (12.0e-6 + 1.5 * message / (0.25 * 32e9))
    assert tp4.step_seconds(1, 1025) - tp4_host.step_seconds(1, 1025) == pytest.approx(2 * 32 * one, rel=1e-9)


def test_across_nodes_the_network_figures_hold_whatever_the_card():
    """TP 2 across two nodes of one A100 40 GB each: over Ethernet (NCCL's sockets: 46 us, 3.9 GB/s) every step
    costs 56 calls x (46 - 30.3) us more than over InfiniBand (30.3 us, 24 GB/s), and every token 56 x 7,168
    bytes x (1 / 3.9 - 1 / 24) ns more; the same on an H100, whose NVLink table does not enter."""
    qwen = kvbudget.load_model("qwen2-7b")
    for gpu in ("A100-40GB", "H100"):
        eth = setup_for(qwen, gpu=gpu, tp=2, max_model_len=4096, interconnect="ethernet").time_model
        ib = setup_for(qwen, gpu=gpu, tp=2, max_model_len=4096, interconnect="infiniband").time_model
        assert "; all-reduce over ethernet: 46.0 us + 3.9 GB/s bus bandwidth" in eth.basis
        assert eth.overhead - ib.overhead == pytest.approx(56 * (46.0e-6 - 30.3e-6), rel=1e-9)
        assert eth.token_cost - ib.token_cost == pytest.approx(56 * 7168 * (1 / 3.9e9 - 1 / 24e9), rel=1e-9)


def test_every_multi_gpu_served_run_records_its_link_with_a_log_line():
    """benchmarks/data/served/runs.json: each run on more than one GPU says how they were linked, and its evidence
    is a line of the start-up log its source names, quoting what vLLM printed about that link."""
    runs = json.loads(SERVED.read_text(encoding="utf-8"))["runs"]
    expect = {"pcie-no-p2p": "Custom allreduce is disabled because your platform lacks GPU",
              "ethernet": "is disabled because this process group spans across nodes."}
    seen = set()
    for run in runs:
        if run["tp"] == 1 or not run["id"].startswith("a100-qwen2-7b-"):
            continue
        link, evidence = run["interconnect"], run["interconnect_evidence"]
        Interconnect.parse(link, "interconnect")
        log, line, quote = re.fullmatch(r"(log/\S+\.log):(\d+) (.+)", evidence).groups()
        assert log in run["source"] and int(line) > 0, run["id"]
        assert expect[link] in quote, run["id"]
        assert (link == "ethernet") == (run["nodes"] > 1), run["id"]
        seen.add(link)
    assert seen == {"pcie-no-p2p", "ethernet"}


def test_the_command_line_refuses_a_bad_link_in_one_line_and_sweeps_over_links(capsys):
    from kvbudget.cli import main

    base = ["simulate", "qwen2-7b", "--gpu", "A100-80GB", "--tp", "2", "--max-model-len", "4096", "--rate", "5",
            "--requests", "20"]
    for bad in ("", "x" * 5000, "NVLink", "pcie,nvlink"):
        assert main([*base, "--interconnect", bad]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("kvbudget: error: --interconnect: "), err[:200]
        assert "Traceback" not in err and len(err) < 300
    assert main([*base, "--interconnect", "pcie"]) == 2
    assert capsys.readouterr().err == ("kvbudget: error: --interconnect pcie: the A100-80GB has no peer-to-peer "
                                       "access over PCIe; choose nvlink, pcie-no-p2p, ethernet, infiniband\n")
    assert main([*base, "--sweep", "interconnect=nvlink,pcie-no-p2p", "--backend", "serial", "--json"]) == 0
    nvlink, host = json.loads(capsys.readouterr().out)
    assert [nvlink["settings"]["interconnect"], host["settings"]["interconnect"]] == ["nvlink", "pcie-no-p2p"]
    assert host["result"]["setup"]["time_model"]["basis"].split("; host costs ")[0].endswith("(estimate)")
    assert host["result"]["tpot_s"]["mean"] > nvlink["result"]["tpot_s"]["mean"]
