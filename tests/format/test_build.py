import tierstore
from tierstore import _C


def test_native_module_imports_and_reports_devices():
    n = _C.cuda_device_count()
    assert n >= 0
    assert tierstore.cuda_available() == (bool(_C.built_with_cuda()) and n > 0)


def test_cuda_build_reports_runtime_version():
    v = _C.cuda_runtime_version()
    assert (v > 0) == bool(_C.built_with_cuda())


def test_cli_help_lists_every_group(capsys):
    from tierstore.cli import build_parser

    text = build_parser().format_help()
    for group in ("pack", "warm", "bench", "demo"):
        assert group in text
