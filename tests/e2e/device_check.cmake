# The device check (tests/gpu/device-check.sh), the parts a CPU can check: its plan fits 8 minutes,
# and its build-only gate refuses a build without every GPU test (the SDPA test included).
kilter_add_e2e_test(e2e_device_check_plan ${CMAKE_CURRENT_LIST_DIR}/device_check_plan.sh)
