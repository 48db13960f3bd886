# The in-run calibration of the plan's cost model (issue 39): a re-planned run keeps 1 rank's
# losses, a resume keeps the fitted plan, off and pinned runs stay bit-identical.
kilter_add_e2e_test(e2e_cost_calibration ${CMAKE_CURRENT_LIST_DIR}/cost_calibration.sh)
