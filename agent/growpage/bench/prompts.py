"""The prompts of the benchmarks' workloads and of the demo, so both run on the same text.

Reasoning prompts ask for step-by-step answers: long generations whose attention moves, so their
requests meet page boundaries. Summary prompts ask for one sentence: short generations that fit
their floor.
"""

from __future__ import annotations

REASONING_PROMPTS = (
    "A farmer has 17 sheep. He buys 5 more, then sells 8. Each remaining sheep gives 3 kg of wool. "
    "How much wool does he get? Think step by step and show every step.",
    "Tom is twice as old as Ann. In 6 years their ages will add up to 48. How old is Ann now? "
    "Solve it step by step.",
    "A train leaves at 9:40 and travels 210 km at 70 km/h, then stops for 15 minutes, then travels "
    "90 km at 60 km/h. When does it arrive? Explain each step.",
    "List the first ten prime numbers, then add them up step by step, showing each partial sum.",
    "A shop sells pens at 3 for $2. How much do 27 pens cost, and how many pens can you buy with "
    "$15? Work through both questions step by step.",
    "Explain step by step how to compute 23 * 47 by hand, then check the result another way.",
)
SUMMARY_PROMPTS = (
    "Summarize in one sentence: The city council met on Tuesday and voted to extend library hours "
    "on weekends, citing strong demand from students during exam season.",
    "Summarize in one sentence: Researchers found that short daily walks improved sleep quality in "
    "older adults more than occasional long hikes.",
    "Summarize in one sentence: The company reported higher revenue this quarter, mainly from its "
    "cloud services, while hardware sales stayed flat.",
    "Summarize in one sentence: Heavy rain flooded several roads overnight; the morning commute "
    "was delayed but no injuries were reported.",
)
# The true final answer of each reasoning prompt above, or None where it is not one number (a
# time of day; two questions in one).
REASONING_ANSWERS = ("42", "12", None, "129", None, "1081")
