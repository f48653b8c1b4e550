"""tests/testports.py: the tests' servers get ports the kernel never hands a client by itself."""
import socket

from testports import bindable, ephemeral_low, free_port


def test_a_free_port_and_the_two_after_it_are_below_the_ephemeral_range_and_free():
    port = free_port()
    assert port + 3 <= ephemeral_low()
    assert all(bindable(port + i) for i in range(3))


def test_a_bound_port_is_not_bindable():
    with socket.socket() as held:
        held.bind(("127.0.0.1", free_port(1)))
        assert not bindable(held.getsockname()[1])


def test_the_range_is_read_from_the_kernel_file(tmp_path):
    path = tmp_path / "range"
    path.write_text("40000\t60999\n")
    assert ephemeral_low(str(path)) == 40000
    assert ephemeral_low(str(tmp_path / "missing")) == 32768
