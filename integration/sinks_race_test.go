//go:build race

package integration

// sinksRaceDetector reports a build with -race.
const sinksRaceDetector = true
