//go:build !race

package brokers_test

// raceDetector reports a build with -race.
const raceDetector = false
