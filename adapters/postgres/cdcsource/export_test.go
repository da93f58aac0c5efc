package cdcsource

// The CDC relay's marker and its settings, for the plan test.
var (
	MarkRelayedForTest  = markRelayed
	MarkSettingsForTest = markSettings
)
