"""Embedded labelled sets: synthetic classification and question-answering items.

They exist so that quality can be measured offline, in tests and examples, with nothing
downloaded. Every item is generated from templates with ``random.Random`` and a fixed seed, so
the sets are identical on every machine and in every release that keeps :data:`VERSION`.

- ``builtin:classify`` — 300 product reviews, each labelled ``positive``, ``negative`` or
  ``neutral`` (100 of each). The prompt names the three labels and ends with ``Sentiment:``.
- ``builtin:qa`` — 300 short questions with one-word answers: sums and differences of small
  numbers, the day after a weekday, the month after a month, and the opposite of a word.
  The prompt ends with ``Answer:``.
"""

from __future__ import annotations

import random
from functools import lru_cache

VERSION = 1
SEED = 20240611
SIZE = 300

CLASSIFY_LABELS = ("positive", "negative", "neutral")

_PRODUCTS = ("blender", "laptop", "backpack", "kettle", "phone case", "desk lamp", "headset", "keyboard",
             "water bottle", "tent", "camera", "coffee grinder", "office chair", "printer", "router")
_OPINIONS = {
    "positive": ("works perfectly", "exceeded my expectations", "is excellent value", "feels solid and well made",
                 "made my mornings easier", "is the best purchase I made this year", "arrived early and works great"),
    "negative": ("stopped working after a week", "is flimsy and overpriced", "broke on the first day",
                 "was a waste of money", "keeps overheating", "arrived damaged and support never answered",
                 "is noisy and disappointing"),
    "neutral": ("does what the box says", "is an ordinary model", "arrived on the expected date",
                "comes in a grey box", "has the usual buttons", "is about as heavy as I expected",
                "is similar to the one I had before"),
}
_ENDINGS = ("", " I use it every day.", " I bought it last month.", " It came with a manual.",
            " My brother has the same one.")

_WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
           "November", "December")
_OPPOSITES = (("hot", "cold"), ("up", "down"), ("early", "late"), ("open", "closed"), ("full", "empty"),
              ("light", "dark"), ("fast", "slow"), ("left", "right"), ("wet", "dry"), ("high", "low"),
              ("old", "new"), ("hard", "soft"), ("inside", "outside"), ("first", "last"), ("day", "night"))
_NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
                 "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen")


@lru_cache(maxsize=1)
def classify_items() -> tuple[tuple[str, str], ...]:
    """The ``builtin:classify`` set: ``(prompt, label)`` pairs, classes interleaved."""
    rng = random.Random(SEED)
    items = []
    for i in range(SIZE):
        label = CLASSIFY_LABELS[i % len(CLASSIFY_LABELS)]
        review = f"The {rng.choice(_PRODUCTS)} {rng.choice(_OPINIONS[label])}.{rng.choice(_ENDINGS)}"
        prompt = ("Classify the sentiment of the review as positive, negative or neutral.\n"
                  f"Review: {review}\nSentiment:")
        items.append((prompt, label))
    return tuple(items)


def _qa_item(kind: int, rng: random.Random) -> tuple[str, str]:
    if kind == 0:
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        return f"What is {_NUMBER_WORDS[a]} plus {_NUMBER_WORDS[b]}?", _NUMBER_WORDS[a + b]
    if kind == 1:
        a = rng.randint(1, 18)
        b = rng.randint(0, a)
        return f"What is {_NUMBER_WORDS[a]} minus {_NUMBER_WORDS[b]}?", _NUMBER_WORDS[a - b]
    if kind == 2:
        d = rng.randrange(7)
        return f"Which day comes after {_WEEKDAYS[d]}?", _WEEKDAYS[(d + 1) % 7]
    if kind == 3:
        m = rng.randrange(12)
        return f"Which month comes after {_MONTHS[m]}?", _MONTHS[(m + 1) % 12]
    word, opposite = rng.choice(_OPPOSITES)
    if rng.random() < 0.5:
        word, opposite = opposite, word
    return f"What is the opposite of {word}?", opposite


@lru_cache(maxsize=1)
def qa_items() -> tuple[tuple[str, str], ...]:
    """The ``builtin:qa`` set: ``(prompt, answer)`` pairs, the five kinds interleaved."""
    rng = random.Random(SEED + 1)
    items = []
    for i in range(SIZE):
        question, answer = _qa_item(i % 5, rng)
        items.append((f"Answer with one word.\nQuestion: {question}\nAnswer:", answer))
    return tuple(items)


LABELLED_SETS = {"classify": classify_items, "qa": qa_items}
