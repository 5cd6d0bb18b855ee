"""The story generator: deterministic from its seed, and full of things worth copying."""
import re
from collections import Counter

from training import corpus
from training.corpus import CONTENT_WORDS, corpus_vocabulary, stories, words_of, write_corpus


def test_same_seed_same_text_other_seed_other_text():
    a = list(stories(3, 50))
    assert a == list(stories(3, 50))
    assert a != list(stories(4, 50))
    assert len(set(a)) == 50                      # no two stories alike


def test_stream_is_a_prefix_of_a_longer_stream():
    # The training loop reads an endless stream; asking for fewer stories gives the same start.
    gen = stories(11)
    first = [next(gen) for _ in range(20)]
    assert first == list(stories(11, 20))


def test_write_corpus(tmp_path):
    p = tmp_path / "c.txt"
    write_corpus(str(p), seed=5, n=7)
    lines = p.read_text(encoding="utf-8").splitlines()
    assert lines == list(stories(5, 7))


def test_every_word_is_in_the_corpus_vocabulary():
    vocab = corpus_vocabulary()
    for story in stories(0, 300):
        for w in words_of(story):
            assert w in vocab, (w, story)


def test_stories_are_sentences_that_end_with_the_end():
    for story in stories(1, 100):
        assert story[0].isupper()
        assert story.endswith("The end.")
        assert re.fullmatch(r"[A-Za-z ,.:]+", story), story
        assert 60 <= len(words_of(story)) <= 420


def _recalled_spans(story, min_len=5):
    """Runs of >= min_len words that occur at least twice in the story."""
    w = words_of(story)
    seen = Counter(tuple(w[i:i + min_len]) for i in range(len(w) - min_len + 1))
    return [k for k, c in seen.items() if c >= 2 and all(x.isalpha() for x in k)]


def test_lists_of_varied_words_recur_in_most_stories():
    st = list(stories(2, 200))
    with_recall = 0
    for s in st:
        spans = _recalled_spans(s)
        # a recalled span of content words (not a fixed phrase like the refrain)
        if any(sum(x.lower() in CONTENT_WORDS or x in CONTENT_WORDS for x in k) >= 4 for k in spans):
            with_recall += 1
    assert with_recall / len(st) > 0.6


def test_secret_list_is_read_back_word_for_word():
    found = 0
    for s in stories(4, 200):
        m = re.search(r"wrote a secret list of words: ([a-zA-Z, ]+)\.", s)
        if m:
            found += 1
            assert f"read the list out loud: {m.group(1)}." in s
    assert found > 30


def test_characters_recur_and_are_referred_to_by_pronouns():
    for s in stories(6, 50):
        w = words_of(s)
        names = [x for x in w if x in corpus.GIRLS or x in corpus.BOYS]
        top = Counter(names).most_common(1)[0]
        assert top[1] >= 3                        # the hero is named again and again
        assert {"she", "he", "She", "He"} & set(w)


def test_random_span_is_large_share_of_words():
    # Induction needs copying to carry weight: words inside a recalled span of >= 5 words
    # should be a real share of the text, not a sprinkle.
    total = copied = 0
    for s in stories(8, 200):
        w = words_of(s)
        total += len(w)
        spans = set(_recalled_spans(s, 5))
        covered = set()
        for i in range(len(w) - 4):
            if tuple(w[i:i + 5]) in spans:
                covered.update(range(i, i + 5))
        copied += len(covered)
    assert copied / total > 0.15


def test_day_names_keep_their_capital_inside_a_sentence():
    text = " ".join(stories(0, 2000))
    assert "On Sunday," in text                    # at a sentence start
    assert "sunday" not in text                    # never lower-cased inside one
    assert "sunday" not in corpus_vocabulary() and "Sunday" in corpus_vocabulary()


def test_random_spans_come_back_after_a_gap_of_other_words():
    # "<span>. <gap>. <span>." with spans of 4-32 words and gaps of 0-12: the copy distance varies.
    lengths, gaps = set(), set()
    for s in stories(9, 400):
        for sentence_a, gap, sentence_b in zip(s.split(". "), s.split(". ")[1:], s.split(". ")[2:]):
            if sentence_a == sentence_b and all(w in CONTENT_WORDS or w.lower() in CONTENT_WORDS
                                                for w in sentence_a.split()):
                lengths.add(len(sentence_a.split()))
                gaps.add(len(gap.split()))
    assert min(lengths) <= 6 and max(lengths) >= 28
    assert max(gaps) >= 10 and min(gaps) <= 2


def test_special_tokens_include_the_mask_for_the_encoder():
    assert corpus.SPECIAL_TOKENS == ("<pad>", "<s>", "</s>", "<unk>", "<mask>")


def test_a_gift_is_also_given_as_the_colour_thing_to_a_name():
    # The encoder's fill-in-the-blank example masks the colour in "Tom gave the red ball to Anna.":
    # that sentence shape must occur in the stories (not only "gave the list to").
    text = " ".join(stories(0, 500))
    colours = "|".join(corpus.COLORS)
    found = re.findall(rf"gave the ({colours}) \w+ to [A-Z]\w+\.", text)
    assert len(found) >= 20
    assert len(set(found)) >= 5
