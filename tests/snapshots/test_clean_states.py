"""CleanStates: what a cache over budget may drop, oldest first, with the bytes it frees."""

from hypothesis import given, strategies as st

from driftstream.snapshots.clean_states import CleanStates


@given(st.lists(st.tuples(st.sampled_from(["add", "discard", "drop"]), st.integers(0, 20), st.integers(0, 50)), max_size=200))
def test_it_keeps_the_order_and_the_bytes_of_a_model(ops):
    """Against a plain ordered dict: the same keys in the same order, the same bytes, and a
    drop takes the oldest keys until they hold the excess, through every compaction."""
    clean, model = CleanStates(), {}
    for op, key, n in ops:
        if op == "add" and key not in model:
            clean.add(key, n)
            model[key] = n
        elif op == "discard":
            clean.discard(key)
            model.pop(key, None)
        elif op == "drop":
            expected, freed = [], 0
            for k, size in model.items():
                if freed >= n:
                    break
                expected.append(k)
                freed += size
            assert clean.drop_oldest(n) == expected
            for k in expected:
                del model[k]
        assert list(clean.sizes.items()) == list(model.items())
        assert clean.bytes == sum(model.values()) and len(clean) == len(model)
        assert all(k in clean for k in model)


def test_the_dict_is_compacted_once_it_dropped_more_than_it_holds():
    clean = CleanStates()
    for k in range(100):
        clean.add(k, 1)
    first = clean.sizes
    clean.drop_oldest(40)
    assert clean.sizes is first  # 40 dropped, 60 held
    clean.drop_oldest(20)
    assert clean.sizes is not first and list(clean.sizes) == list(range(60, 100))


def test_bytes_a_loop_changed_are_counted():
    clean = CleanStates()
    clean.sizes["a"] = 7  # as snapshots/_written.c's mark_clean adds
    clean.changed_by(7)
    clean.sizes.pop("a")  # as its put_all frees
    clean.changed_by(-7)
    assert clean.bytes == 0 and len(clean) == 0
