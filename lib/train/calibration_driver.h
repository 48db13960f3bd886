// The in-run calibration as the step loop drives it (data.cost_calibration = auto; docs/plan.md,
// "In-run calibration"). Rank 0 fits a window of steps (CostCalibration) and builds and compares
// the division the fit makes in the background; where it pays, its verdict rides in a step's
// reduction; every rank then receives the model in one broadcast and builds the same plan in the
// background; once a reduction says every rank has it, one collective picks the first step no
// reader has been fed from, and the plan switches there (the cut-cost check's machinery). Steps
// and their tokens never change, only who computes what; no step waits for a plan to be built.
#pragma once
#include <string>

#include "lib/train/run_setup.h"

namespace kilter::train {

// make_run(): the settings (data.cost_calibration, pinned coefficients, world size, sampler), and
// on rank 0 the step records' hook (beside the cut-cost check's).
void start_calibration(Run& run);
// load_state() of a resume: the models the run put in force (checkpoint attribute
// cost_calibration), each from its step, so the resumed run divides its steps as the run did;
// with data.cost_calibration = off, the derived model. Rank 0 says which.
void restore_calibration(Run& run);
// Before a step's reduction: rank 0's window fitted, its candidate compared, and this rank's flags
// for the reduction (StepContext::calibration_verdict, replan_building).
void calibration_before_step(Run& run);
// After the step is counted: acts on what the reduction carried. Collective where it says so.
void calibration_after_step(Run& run, const ReducedStep& reduced);
// Every rank alike (a collective decision, e.g. the cut-cost check re-planned): the calibration's
// candidate is dropped; the next window starts at the next step.
void abandon_calibration(Run& run, const std::string& why);

}  // namespace kilter::train
