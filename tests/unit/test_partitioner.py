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


# Keys whose murmur2 is negative: Java's Utils.toPositive keeps the low 31 bits (h & 0x7fffffff, i.e.
# h + 2**31), which is not abs(h). For b"21": h = -973932308 -> toPositive 1173551340, abs 973932308.
@pytest.mark.parametrize("key,partitions,expected", [
    (b"21", 10, 1173551340 % 10),  # 0 (abs would give 8)
    (b"21", 7, 1173551340 % 7),  # 3 (abs: 6)
    (b"foobar", 10, (2**31 - 790332482) % 10),  # 6 (abs: 2)
    (b"a-little-bit-long-string", 3, (2**31 - 985981536) % 3),  # 2 (abs: 0)
    (b"abc", 10, 479470107 % 10),  # a positive hash is used as it is
])
def test_negative_hashes_use_java_to_positive(key, partitions, expected):
    assert java_partition(key, partitions) == expected


def test_partition_is_positive_modulo():
    assert all(0 <= java_partition(bytes([i]) * i, 7) < 7 for i in range(1, 50))


def test_kraft_cluster_ids_never_look_like_options():
    from mirror_core.local import _kraft_id

    ids = [_kraft_id() for _ in range(2000)]
    assert all(len(i) == 22 and not i.startswith("-") for i in ids)
