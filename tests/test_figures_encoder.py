"""The Encoder vs decoder figures that the fill-in-the-blank view adds: pure data in, figure out."""
import numpy as np

from explorer.figures import encoder_decoder as fe


def test_fill_in_blank_bars_keep_each_models_order_and_values():
    f = fe.fill_in_blank_figure(["red", "big", "blue"], [0.5, 0.3, 0.1], ["small", "red"], [0.6, 0.2],
                                hidden="red", left_title="encoder", right_title="decoder")
    left, right = f.data
    assert list(left.x) == [0.5, 0.3, 0.1] and list(right.x) == [0.6, 0.2]   # not swapped
    assert list(left.y) == ["1·red", "2·big", "3·blue"] and list(right.y) == ["1·small", "2·red"]
    assert left.marker.color[0] != left.marker.color[1]                     # the hidden word stands out
    assert right.marker.color[1] == left.marker.color[0]
    assert f.layout.xaxis.range == (0, 1) and f.layout.xaxis2.range == (0, 1)
    assert f.layout.yaxis.autorange == "reversed"                           # best guess on top


def test_fill_in_blank_without_a_decoder_leaves_its_side_empty():
    f = fe.fill_in_blank_figure(["a", "b"], [0.7, 0.2], None, None, hidden="c", left_title="encoder",
                                right_title="decoder: another tokenizer")
    assert len(f.data) == 1 and list(f.data[0].x) == [0.7, 0.2]
    assert "another tokenizer" in f.layout.annotations[1].text


def test_side_by_side_maps_take_each_sides_own_tokens():
    left = np.eye(3)
    right = np.full((2, 2), 0.5)
    f = fe.side_by_side_maps(left, right, ["0·a", "1·b", "2·c"], right_labels=["0·x", "1·y"], left_title="l",
                             right_title="r", title="t")
    assert list(f.data[0].x) == ["0·a", "1·b", "2·c"] and list(f.data[1].x) == ["0·x", "1·y"]
    np.testing.assert_array_equal(np.asarray(f.data[1].z), right)
