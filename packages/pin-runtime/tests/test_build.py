"""What a process says it is: `--version`, the build-info metric, the spans' resource."""

from __future__ import annotations

import importlib.metadata
import platform

from prometheus_client import CollectorRegistry

from pin_runtime.build import BuildInfo, register_process_metrics


def test_the_build_is_the_installed_versions_and_the_images_revision() -> None:
    build = BuildInfo.of("pin-runtime", {"PIN_BUILD_REVISION": " 9e1f00c "})
    assert build.version == importlib.metadata.version("pin-runtime")
    assert build.contracts_version == importlib.metadata.version("pin-contracts")
    assert build.revision == "9e1f00c"
    assert build.python_version == platform.python_version()
    assert build.metric_name == "pin_runtime_build"
    assert set(build.labels()) == {"version", "revision", "contracts_version", "python_version"}


def test_outside_an_image_the_revision_and_an_unknown_package_say_unknown() -> None:
    build = BuildInfo.of("no-such-service", {})
    assert (build.version, build.revision) == ("unknown", "unknown")
    assert build.metric_name == "no_such_service_build"
    assert build.line().startswith("no-such-service unknown (revision unknown, pin-contracts ")


def test_a_private_registry_gets_the_process_and_python_collectors() -> None:
    registry = CollectorRegistry()
    register_process_metrics(registry, BuildInfo.of("pin-runtime", {"PIN_BUILD_REVISION": "r1"}))
    assert (
        registry.get_sample_value(
            "pin_runtime_build_info",
            {
                "version": importlib.metadata.version("pin-runtime"),
                "revision": "r1",
                "contracts_version": importlib.metadata.version("pin-contracts"),
                "python_version": platform.python_version(),
            },
        )
        == 1
    )
    assert (registry.get_sample_value("process_resident_memory_bytes") or 0) > 0
    assert (
        registry.get_sample_value(
            "python_info",
            {
                "implementation": platform.python_implementation(),
                "major": str(platform.python_version_tuple()[0]),
                "minor": str(platform.python_version_tuple()[1]),
                "patchlevel": str(platform.python_version_tuple()[2]),
                "version": platform.python_version(),
            },
        )
        == 1
    )
