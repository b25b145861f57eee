// Package traffic is a chaos run's workload: the task workers (Worker),
// in the test process or in helper processes that re-execute the test
// binary (IsWorkerProcess, RunWorkerProcess), with their contended cycle
// and the stranding control; the pool workload (PoolWorker) and the
// recorder of its transactions; the recipe workload's election and
// semaphore workers; the fleet mode (Fleet) with its feeder and killer;
// the skewed clocks; the controls' raw pruner (RawPruner); and the
// fenced downstream writes they all make. Everything a worker does is
// recorded into the run's model.History.
//
// It reads packages model and nemesis (the worker slots, Slot, and the
// gate that freezes a worker, Gate), and gets what it needs of the run
// in its Env. The suite's overview is package chaos's documentation.
package traffic
