package relaystore

// The relay's read and its settings, for the plan test.
var (
	ReadByIDForTest     = readByID
	ReadSettingsForTest = readSettings
)
