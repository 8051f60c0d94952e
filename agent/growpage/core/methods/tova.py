"""TOVA (Oren et al., "Transformers are Multi-State RNNs", 2024): Token Omission Via Attention.

A fixed cap that, when the budget is reached, drops the tokens the *current* query attends to
least (its attention averaged over heads): no accumulation, no window, the newest observation
alone. As a method here it is H2O's cap with scores that keep only the newest observation
(``step_decay`` 0), so it runs in both homes, with per-KV-head keep sets inside vLLM.

Simplifications, stated: the paper ranks every layer by that layer's attention; here the observed
layers' mean ranks one keep set (per KV head inside vLLM), as every scored method does.
"""

from __future__ import annotations

from growpage.core.methods.base import register
from growpage.core.methods.caps import FixedCap

register("tova", lambda seed: FixedCap("tova", step_decay=0.0, in_vllm=True))
