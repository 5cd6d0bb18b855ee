"""The prompt and the (transformers Llama, our Decoder) pair the walkthrough tests share
(tests/test_walkthrough*.py)."""
import pytest

from tests.llama_pair import llama_pair

IDS = [3, 17, 5, 17, 42, 8, 17, 5, 60, 2, 33]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(transformers Llama, our Decoder) on the same random weights, tied embeddings, 3 layers, GQA 4/2."""
    return llama_pair(tmp_path_factory.mktemp("walk-pair"), tied=True)


@pytest.fixture(scope="module")
def model(pair):
    return pair[1]
