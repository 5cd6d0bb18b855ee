"""Simple English stories, written deterministically from a seed.

The shipped default model is trained on this text. The stories are built so that the three things
the explorer shows in attention have something to learn from:

- copying / induction: lists of varied words (shopping lists, animals seen, a "secret list" of
  random words, a random span of words said twice) appear once and are recalled later in the same
  story, word for word, so predicting the recall means finding the earlier copy and reading the
  word that followed it;
- coreference: every story has recurring named characters referred to by pronouns (she / he,
  her / his) and recurring objects and places referred to again with "the";
- local structure: fixed phrases ("Once upon a time", "The end.") and a refrain repeated through
  the story.

A "random span" is a run of words drawn uniformly from the content-word list (names, animals,
things, foods, colours, ...), with no grammar at all; it is there because a model trained on
templated stories alone barely learns induction (see shared DESIGN.md, "Facts that bite").

Everything is drawn from one ``random.Random(seed)``: the same seed gives the same text, on any
machine and any Python 3.
"""
from __future__ import annotations

import random
import re
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = [
    "CONTENT_WORDS",
    "SPECIAL_TOKENS",
    "corpus_vocabulary",
    "make_story",
    "stories",
    "write_corpus",
    "words_of",
]

# Special tokens of the tokenizer trained on this corpus (ids 0..4 in this order). ``<mask>`` is what
# the encoder's masked-language-model training puts in place of a hidden word.
SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<unk>", "<mask>")

# ---------------------------------------------------------------------------------------------
# Word lists. Kept short and concrete; every word here becomes (at most) one token.
# ---------------------------------------------------------------------------------------------
GIRLS = (
    "Mia Lily Emma Anna Sara Lucy Zoe Ella Ruby Nora Maya Ivy Rosa Kate Jane Amy Hana Lena Tara "
    "Alice Clara Daisy Grace Holly Iris Julia Luna Molly Olive Poppy Rose Sophie Stella Wendy "
    "Ada Bella Chloe Dora Eva Fiona Gina Heidi Jenny Kira Laura Mila Nina Paula Rita Tina Vera"
).split()
BOYS = (
    "Tom Ben Sam Max Leo Jack Tim Finn Noah Liam Owen Jake Luke Adam Eli Hugo Ivan Omar Paul "
    "Oscar Felix Henry Jonah Kevin Louis Mark Peter Ryan Simon Theo Victor Walter Arthur Bruno "
    "Alex Carl Dan Eric Frank George Harry Jim Karl Leon Mike Nick Otto Ralph Steve Toby Zack"
).split()
ANIMALS = (
    "cat dog bird fish frog duck cow pig goat sheep horse hen fox bear rabbit mouse owl lion "
    "tiger zebra monkey snake turtle whale bee ant deer wolf seal crab snail goose donkey puppy "
    "kitten parrot camel panda squirrel spider eagle beaver hippo koala otter pony "
    "lamb calf chick moose badger hedgehog penguin dolphin shark octopus giraffe kangaroo "
    "lizard beetle moth butterfly worm raven robin swan crow bat rat toad"
).split()
THINGS = (
    "ball kite box cup hat book doll drum boat car train bike lamp bell key map rope sock shoe "
    "coat bag clock spoon bowl chair bed blanket pillow ring shell stone stick flag basket bucket "
    "brush comb crown cape mask robot truck wagon whistle candle mirror jar umbrella balloon "
    "feather ribbon button puzzle scarf glove sled block crayon "
    "pencil paper letter card coin purse wallet ladder hammer shovel rake kettle plate fork "
    "knife basket tent rocket plane ship guitar flute piano violin trumpet necklace bracelet "
    "watch teapot vase statue picture painting sticker marble jacket boot sweater helmet "
    "backpack lantern torch compass tablet radio camera"
).split()
FOODS = (
    "apples bread milk eggs cheese jam honey carrots grapes cake cookies soup rice beans pears "
    "plums nuts butter lemons oranges peas corn tea pie berries bananas melon pasta muffins "
    "pancakes tomatoes potatoes onions peaches cherries "
    "cucumbers pumpkins apricots salad sandwiches noodles yogurt waffles popcorn pizza "
    "strawberries blueberries peanuts crackers sausages lettuce mushrooms beets radishes"
).split()
PLACES = (
    "park garden beach forest farm river lake hill school shop market library kitchen village "
    "castle zoo meadow pond field barn playground bakery station harbor island cave mountain "
    "valley street bridge yard attic "
    "town city desert jungle museum hospital church tower lighthouse orchard pier camp "
    "stadium circus theater palace temple square"
).split()
ROOMS = "kitchen bedroom attic basement hallway bathroom garage porch cellar closet".split()
HIDING = (
    "bed table chair sofa tree bush rug bench desk stairs box blanket pillow bucket basket"
).split()
COLORS = ("red blue green yellow pink purple orange brown black white gray gold silver violet "
          "beige golden").split()
SIZES = ("big small little tiny huge long short round soft shiny old new heavy light thin fat "
         "tall flat smooth rough fluffy bright dark").split()
TRAITS = (
    "kind brave happy shy clever funny curious gentle quiet busy friendly careful cheerful "
    "little young polite proud silly sleepy strong smart wise calm bold honest lucky noisy "
    "patient playful loyal generous"
).split()
FEELINGS = "happy sad glad angry scared tired hungry excited proud surprised worried".split()
KINDS_F = "girl lady princess queen".split()
KINDS_M = "boy man prince king".split()
PARENTS = (("Mom", "she", "her"), ("Dad", "he", "his"), ("Grandma", "she", "her"),
           ("Grandpa", "he", "his"))
WEATHER = "sunny rainy windy cold warm snowy cloudy".split()
TIMES = ("One day", "One morning", "The next day", "That afternoon", "Later that day",
         "In the evening", "After lunch", "Before dinner", "On Sunday", "Soon")
VERBS_PLAY = (
    "played with", "looked at", "painted", "cleaned", "hugged", "carried", "found", "hid",
    "shared", "fixed", "washed", "showed everyone",
)
REFRAINS = (
    "I can do it if I try",
    "slow and steady wins the race",
    "a friend in need is a friend indeed",
    "one more time and then we rest",
    "we will find it before the sun goes down",
    "look and listen and you will see",
    "the sky is big and so are we",
    "step by step we go up the hill",
    "little by little the cup gets full",
    "never give up and never stop",
)

# Words a random span is drawn from: every concrete content word above (names keep their capital).
CONTENT_WORDS: tuple[str, ...] = tuple(sorted(set(
    GIRLS + BOYS + ANIMALS + THINGS + FOODS + PLACES + ROOMS + HIDING
    + COLORS + SIZES + TRAITS + FEELINGS + WEATHER
)))


@dataclass
class _Person:
    name: str
    they: str    # she / he
    them: str    # her / him
    their: str   # her / his


def _person(rng: random.Random, taken: set[str]) -> _Person:
    girl = rng.random() < 0.5
    pool = GIRLS if girl else BOYS
    name = rng.choice([n for n in pool if n not in taken])
    taken.add(name)
    if girl:
        return _Person(name, "she", "her", "her")
    return _Person(name, "he", "him", "his")


def _cap(s: str) -> str:
    return s[:1].upper() + s[1:]


def _uncap(s: str) -> str:
    # Only the first letter: "On Sunday" inside a sentence is "on Sunday", never "on sunday".
    return s[:1].lower() + s[1:]


def _and_list(items: list[str], article: str = "") -> str:
    """'a, b and c' (with an optional article before each item)."""
    parts = [f"{article}{x}" for x in items]
    if len(parts) == 1:
        return parts[0]
    return ", ".join(parts[:-1]) + " and " + parts[-1]


def _a(word: str) -> str:
    return ("an " if word[0] in "aeiou" else "a ") + word


class _Story:
    """State shared by the scenes of one story: who is in it and what they own."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        taken: set[str] = set()
        self.hero = _person(rng, taken)
        self.friend = _person(rng, taken)
        self.parent = rng.choice(PARENTS)
        self.color = rng.choice(COLORS)
        self.size = rng.choice(SIZES)
        self.thing = rng.choice(THINGS)
        self.place = rng.choice(PLACES)
        self.pet = rng.choice(ANIMALS)
        self.pet_name = rng.choice([n for n in GIRLS + BOYS if n not in taken])
        self.refrain = rng.choice(REFRAINS)
        self.sentences: list[str] = []

    def say(self, *sentences: str) -> None:
        self.sentences.extend(_cap(s) for s in sentences)

    # -- scenes --------------------------------------------------------------------------
    def intro(self) -> None:
        r, h = self.rng, self.hero
        kind = r.choice(KINDS_F if h.they == "she" else KINDS_M)
        trait = r.choice(TRAITS)
        if r.random() < 0.5:
            self.say(f"once upon a time, there was {_a(trait)} {kind} named {h.name}.")
        else:
            self.say(f"{h.name} was {_a(trait)} {kind} who lived near the {self.place}.")
        self.say(f"{h.they} had a {self.size} {self.color} {self.thing}.",
                 f"{h.they} loved the {self.color} {self.thing} very much.")
        if r.random() < 0.5:
            self.say(f"{h.name} also had a {self.pet} named {self.pet_name}.")

    def visit(self) -> None:
        r, h, f = self.rng, self.hero, self.friend
        self.say(f"{_uncap(r.choice(TIMES))}, {h.name} and {f.name} went to the {self.place}.",
                 f"it was a {r.choice(WEATHER)} day.")
        verb = r.choice(VERBS_PLAY)
        self.say(f"{h.name} {verb} the {self.thing} and {f.name} watched.",
                 f"{f.they} said that the {self.thing} was very {r.choice(SIZES)}.")

    def shopping(self) -> None:
        r, h = self.rng, self.hero
        p, p_they, _ = self.parent
        items = r.sample(FOODS, r.randint(3, 7))
        self.say(f"{p} asked {h.name} to buy {_and_list(items)}.",
                 f"{h.name} went to the {r.choice(['shop', 'market', 'bakery'])}.")
        if r.random() < 0.5:
            self.say(f"on the way, {h.they} said the list again: {_and_list(items)}.")
        self.say(f"{h.they} bought {_and_list(items)} and went home.",
                 f"{p} was {r.choice(['happy', 'glad', 'proud'])} and said thank you to {h.them}.")

    def animals(self) -> None:
        r, h, f = self.rng, self.hero, self.friend
        seen = r.sample(ANIMALS, r.randint(3, 6))
        where = r.choice(["farm", "zoo", "forest", "river", "meadow"])
        self.say(f"at the {where}, {h.name} and {f.name} saw {_and_list(seen, 'a ')}.")
        first = r.choice(seen)
        self.say(f"{f.name} liked the {first} best.")
        p = self.parent[0]
        self.say(f"at home, {h.name} told {p} about the {_and_list(seen, '')}.")

    def secret_list(self) -> None:
        r, h, f = self.rng, self.hero, self.friend
        span = r.sample(CONTENT_WORDS, r.randint(5, 16))
        commas = r.random() < 0.5
        text = ", ".join(span) if commas else " ".join(span)
        self.say(f"{h.name} wrote a secret list of words: {text}.")
        if r.random() < 0.5:
            self.say(f"{h.they} gave the list to {f.name}.")
        self.say(f"later, {f.name} read the list out loud: {text}.")

    def random_span(self) -> None:
        # A span of random words, then the same span again; no grammar at all. Span lengths and the
        # gap between the copies vary widely so that the copy distance is no cue to copying.
        r = self.rng
        span = r.sample(CONTENT_WORDS, r.randint(4, 32))
        text = " ".join(span)
        gap = " ".join(r.sample(CONTENT_WORDS, r.randint(0, 12)))
        self.say(f"{text}." + (f" {_cap(gap)}." if gap else "") + f" {_cap(text)}.")

    def lost(self) -> None:
        r, h = self.rng, self.hero
        rooms = r.sample(ROOMS, 2)
        spot = r.choice(HIDING)
        self.say(f"{_uncap(r.choice(TIMES))}, {h.name} could not find {h.their} {self.color} "
                 f"{self.thing}.",
                 f"{h.they} looked in the {rooms[0]} and in the {rooms[1]}.",
                 f"at last, {h.they} found the {self.color} {self.thing} under the {spot}.",
                 f"{h.name} was so {r.choice(['happy', 'glad', 'excited'])}.")

    def gift(self) -> None:
        r, h, f = self.rng, self.hero, self.friend
        feeling = r.choice(["sad", "tired", "worried", "scared"])
        self.say(f"{f.name} was {feeling} because {f.they} had lost {f.their} {r.choice(THINGS)}.",
                 # Both orders of the gift, so "gave the <colour> <thing> to <name>" is written
                 # too: the encoder's fill-in-the-blank example ("Tom gave the red ball to Anna.")
                 # must have been seen as a sentence shape, not only "gave the list to".
                 f"{h.name} gave {f.them} the {self.color} {self.thing}." if r.random() < 0.5
                 else f"{h.name} gave the {self.color} {self.thing} to {f.name}.",
                 f"{f.name} smiled and said thank you to {h.name}.",
                 f"now {f.name} was {r.choice(['happy', 'glad'])} too.")

    def pet_scene(self) -> None:
        r, h = self.rng, self.hero
        self.say(f"{h.name} took {h.their} {self.pet} {self.pet_name} to the {self.place}.",
                 f"{self.pet_name} ran to the {r.choice(HIDING)} and back.",
                 f"{h.name} laughed at {self.pet_name}, the {r.choice(SIZES)} {self.pet}.")

    def refrain_scene(self) -> None:
        h = self.hero
        self_ = "herself" if h.they == "she" else "himself"
        if self.rng.random() < 0.5:
            self.say(f"{h.name} said to {self_}, {self.refrain}.")
        else:
            self.say(f"{h.name} said, {self.refrain}.")

    def ending(self) -> None:
        r, h, f = self.rng, self.hero, self.friend
        if r.random() < 0.5:
            self.say(f"that night, {h.name} went to bed and dreamed about the {self.color} "
                     f"{self.thing}.")
        else:
            self.say(f"{h.name} and {f.name} were {r.choice(FEELINGS)} and went home.")
        self.say("the end.")


def make_story(rng: random.Random) -> str:
    """One story: an intro, a few scenes in random order, an ending. About 120-260 words."""
    s = _Story(rng)
    s.intro()
    scenes = [s.visit, s.shopping, s.animals, s.secret_list, s.lost, s.gift, s.random_span]
    if "named" in " ".join(s.sentences):
        scenes.append(s.pet_scene)
    rng.shuffle(scenes)
    # Recall of varied words is what teaches induction: keep it in nearly every story.
    chosen = scenes[: rng.randint(3, 5)]
    if s.secret_list not in chosen and s.random_span not in chosen and rng.random() < 0.8:
        chosen.append(rng.choice([s.secret_list, s.random_span]))
    for i, scene in enumerate(chosen):
        scene()
        if i % 2 == 1:
            s.refrain_scene()
    s.ending()
    return " ".join(s.sentences)


def stories(seed: int, n: int | None = None) -> Iterator[str]:
    """Yield `n` stories (forever if None), deterministically from `seed`."""
    rng = random.Random(seed)
    i = 0
    while n is None or i < n:
        yield make_story(rng)
        i += 1


def write_corpus(path: str, seed: int, n: int) -> None:
    """Write `n` stories to `path`, one per line (UTF-8)."""
    with open(path, "w", encoding="utf-8") as fh:
        for story in stories(seed, n):
            fh.write(story + "\n")


def words_of(text: str) -> list[str]:
    """Split text into words and punctuation marks (., : ,) the way the corpus writes them."""
    return re.findall(r"[A-Za-z]+|[^A-Za-z\s]", text)


def corpus_vocabulary() -> frozenset[str]:
    """Every word (and punctuation mark) the generator can write, in the case it can appear."""
    words: set[str] = set(".,:")
    fixed = (
        "once upon a time there was an named who lived near the had loved very much also and "
        "went to it day watched said that asked buy on way list again bought home was thank you "
        "at saw liked best told about wrote secret of words gave read out loud later could not "
        "find looked in last found under so because lost smiled now too took ran back laughed "
        "herself himself him her his she he that night bed dreamed were end shop market bakery "
        "glad proud happy excited sad tired worried scared"
    ).split()
    for w in fixed:
        words.update((w, _cap(w)))
    for t in TIMES:
        words.update(t.split())
        words.add(_uncap(t.split()[0]))
    for v in VERBS_PLAY:
        words.update(v.split())
    for r in REFRAINS:
        words.update(r.split())
    for lst in (ANIMALS, THINGS, FOODS, PLACES, ROOMS, HIDING, COLORS, SIZES, TRAITS, FEELINGS,
                KINDS_F, KINDS_M, WEATHER, CONTENT_WORDS):
        words.update(lst)
        words.update(_cap(w) for w in lst)
    words.update(GIRLS + BOYS)
    words.update(p[0] for p in PARENTS)
    return frozenset(words)


if __name__ == "__main__":  # pragma: no cover - a quick look at the text
    for st in stories(0, 3):
        print(st, "\n")
