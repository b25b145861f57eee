// Package report writes what a chaos run with violations, or with a
// liveness goal missed, leaves behind to find out why: WriteArtifacts
// puts the seed, the fault log, the history, the workers' sessions, the
// violations, the summary, the recipe operations, the fleet's takeovers
// and porcupine's visualisation of illegal partitions in a folder.
//
// It reads packages checks and model only. The suite's overview is
// package chaos's documentation.
package report
