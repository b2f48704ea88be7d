import pytest

from mirror_core.partitioner import java_partition, murmur2


# Vectors from Kafka's own UtilsTest (Utils.murmur2).
@pytest.mark.parametrize("data,expected", [
    (b"21", -973932308),
    (b"foobar", -790332482),
    (b"a-little-bit-long-string", -985981536),
    (b"a-little-bit-longer-string", -1486304829),
    (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    (b"abc", 479470107),
])
def test_murmur2_matches_java(data, expected):
    assert murmur2(data) == expected


def test_partition_is_positive_modulo():
    assert all(0 <= java_partition(bytes([i]) * i, 7) < 7 for i in range(1, 50))


def test_kraft_cluster_ids_never_look_like_options():
    from mirror_core.local import _kraft_id

    ids = [_kraft_id() for _ in range(2000)]
    assert all(len(i) == 22 and not i.startswith("-") for i in ids)
