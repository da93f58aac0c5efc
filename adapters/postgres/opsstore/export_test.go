package opsstore

// The failover check's lookup and its settings, for the plan test.
const (
	InspectEventsForTest   = inspectEvents
	InspectSettingsForTest = inspectSettings
)
