package fencesql

// DefaultTable is the table a Guard uses without WithTable.
const DefaultTable = defaultTable
