"""STS histogram and LTS entropy on hand-computed examples."""

import math

import pytest
import torch

from growpage.config import GrowPageConfig
from growpage.core.summaries import SummaryBank, summarize_attention

CONFIG = GrowPageConfig(sts_window_steps=4, sts_num_bins=8, lts_update_interval_steps=2, lts_window_steps=8)


def observe_steps(bank, row, bin_mass, entropy, steps):
    rows = torch.tensor([row])
    for _ in range(steps):
        bank.observe(rows, torch.tensor([bin_mass], dtype=torch.float32), torch.tensor([entropy]))


def test_density_counts_bins_with_enough_mass():
    bank = SummaryBank(CONFIG, max_requests=2)
    # Mass on 3 bins of 8, each well above 1/16: density 3/8.
    observe_steps(bank, 0, [0.5, 0.3, 0.2, 0, 0, 0, 0, 0], 1.0, steps=4)
    assert bank.read([0])[0].sts_density == pytest.approx(3 / 8)


def test_uniform_attention_is_fully_dense_and_active_threshold_is_inclusive():
    bank = SummaryBank(CONFIG, max_requests=1)
    observe_steps(bank, 0, [1 / 8] * 8, 1.0, steps=2)
    assert bank.read([0])[0].sts_density == 1.0
    bank.reset([0])
    # Exactly 1/16 in two bins (after uint8 storage) still counts as active.
    observe_steps(bank, 0, [1 / 16, 1 / 16, 7 / 8, 0, 0, 0, 0, 0], 1.0, steps=1)
    assert bank.read([0])[0].sts_density == pytest.approx(3 / 8)


def test_window_forgets_old_steps():
    bank = SummaryBank(CONFIG, max_requests=1)
    observe_steps(bank, 0, [1 / 8] * 8, 1.0, steps=4)  # dense
    observe_steps(bank, 0, [1.0, 0, 0, 0, 0, 0, 0, 0], 1.0, steps=4)  # window now only sees bin 0
    assert bank.read([0])[0].sts_density == pytest.approx(1 / 8)


def test_lts_is_bias_corrected_from_the_first_update():
    bank = SummaryBank(CONFIG, max_requests=1)
    observe_steps(bank, 0, [1.0] + [0] * 7, 2.5, steps=2)  # one update of a constant 2.5 stream
    assert bank.read([0])[0].lts_entropy == pytest.approx(2.5, rel=1e-5)
    observe_steps(bank, 0, [1.0] + [0] * 7, 2.5, steps=20)
    assert bank.read([0])[0].lts_entropy == pytest.approx(2.5, rel=1e-5)


def test_lts_follows_the_ema_by_hand():
    bank = SummaryBank(CONFIG, max_requests=1)
    decay = CONFIG.lts_ema_decay  # 1 - 2/8 = 0.75
    observe_steps(bank, 0, [1.0] + [0] * 7, 1.0, steps=2)
    observe_steps(bank, 0, [1.0] + [0] * 7, 3.0, steps=2)
    ema = (1 - decay) * 1.0
    ema = decay * ema + (1 - decay) * 3.0
    expected = ema / (1 - decay ** 2)
    assert bank.read([0])[0].lts_entropy == pytest.approx(expected, rel=1e-5)


def test_lts_before_the_first_update_is_the_running_mean():
    bank = SummaryBank(GrowPageConfig(), max_requests=1)
    observe_steps(bank, 0, [1.0] + [0] * 7, 1.0, steps=1)
    observe_steps(bank, 0, [1.0] + [0] * 7, 2.0, steps=1)
    assert bank.read([0])[0].lts_entropy == pytest.approx(1.5)


def test_rows_are_independent_and_reset():
    bank = SummaryBank(CONFIG, max_requests=3)
    bank.observe(torch.tensor([0, 2]), torch.tensor([[1 / 8] * 8, [1.0] + [0] * 7]), torch.tensor([1.0, 3.0]))
    first, untouched, third = bank.read([0, 1, 2])
    assert first.sts_density == 1.0 and third.sts_density == pytest.approx(1 / 8)
    assert untouched.steps_observed == 0 and untouched.sts_density == 0.0
    bank.reset([0])
    assert bank.read([0])[0].steps_observed == 0


def test_summary_fits_the_seeds_2kb_budget():
    bank = SummaryBank(GrowPageConfig(), max_requests=4)
    assert bank.bytes_per_request() == GrowPageConfig().summary_bytes_per_request
    assert bank.bytes_per_request() < 2048
    assert bank.sts_ring.dtype == torch.uint8


def test_summarize_attention_bins_and_entropy():
    # One row, 2 heads, 8 keys at positions 0..7 of a length-8 request: bin i = position i.
    probs = torch.zeros(1, 2, 8)
    probs[0, 0, :4] = 0.25  # uniform over 4 keys: entropy ln 4
    probs[0, 1, 0] = 1.0  # one-hot: entropy 0
    bins, entropy = summarize_attention(probs, torch.arange(8)[None], torch.tensor([8]), 8)
    assert bins[0].tolist() == pytest.approx([0.625, 0.125, 0.125, 0.125, 0, 0, 0, 0])
    assert entropy.item() == pytest.approx(math.log(4) / 2)


def test_summarize_attention_ignores_padding_and_bins_by_logical_position():
    probs = torch.tensor([[[0.5, 0.5, 0.0]]])
    positions = torch.tensor([[0, 15, -1]])  # a hole: positions 1..14 were evicted
    bins, _ = summarize_attention(probs, positions, torch.tensor([16]), 8)
    assert bins[0].tolist() == pytest.approx([0.5, 0, 0, 0, 0, 0, 0, 0.5])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_observe_never_synchronises_with_the_host():
    bank = SummaryBank(CONFIG, max_requests=2, device="cuda")
    rows = torch.tensor([0, 1], device="cuda")
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(5):
            bank.observe(rows, torch.full((2, 8), 1 / 8, device="cuda"), torch.tensor([1.0, 2.0], device="cuda"))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert bank.steps.tolist() == [5, 5]
