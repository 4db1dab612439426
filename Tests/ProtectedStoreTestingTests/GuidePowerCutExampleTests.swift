import Foundation
import ProtectedStore
import ProtectedStoreTesting
import Testing

// The save path under test: the app's settings, replaced whole on every save.
func saveSettings(_ settings: [String: String], in container: Container) throws {
    try container.write(try JSONEncoder().encode(settings), toPath: "Library/Preferences/settings.json", options: .atomic)
}

func loadSettings(from container: Container) throws -> [String: String] {
    try JSONDecoder().decode([String: String].self, from: try container.contents(atPath: "Library/Preferences/settings.json"))
}

@Test("a power cut during a save leaves the old settings or the new ones; a full disk fails the save and loses nothing")
func settingsSurvivePowerCutsAndFullDisks() async throws {
    let device = try TestDevice()
    try saveSettings(["theme": "light"], in: device.container)

    try await device.everyPowerCut(during: {
        try saveSettings(["theme": "dark"], in: device.container)
    }, afterReboot: { rebooted in
        try await rebooted.unlock()
        try #require([["theme": "light"], ["theme": "dark"]].contains(try loadSettings(from: rebooted.container)))
    })

    let error = await #expect(throws: CocoaError.self) {
        try await device.failingWrites(with: .noSpace) { try saveSettings(["theme": "blue"], in: device.container) }
    }
    #expect(error?.code == .fileWriteOutOfSpace)
    #expect(try loadSettings(from: device.container) == ["theme": "dark"])
}
