import Foundation
import ProtectedStore
import ProtectedStoreTesting
import Testing

// The app under test: keeps a draft in memory, and saves it when it goes to the background, as iOS asks.
final class DraftEditor: ApplicationDelegate {
    let container: Container
    var draft = ""

    init(container: Container) { self.container = container }

    func application(_ application: Application, didFinishLaunchingWithOptions launchOptions: [Application.LaunchOptionsKey: Any]?) -> Bool {
        draft = (try? String(decoding: container.contents(atPath: "Documents/draft.txt"), as: UTF8.self)) ?? ""
        return true
    }

    func applicationDidEnterBackground(_ application: Application) {
        // The save may need more than the first seconds: ask for time, and give it back when done.
        let task = application.beginBackgroundTask(withName: "save draft")
        try? container.write(Data(draft.utf8), toPath: "Documents/draft.txt", options: .atomic)
        application.endBackgroundTask(task)
    }
}

@Test("a draft typed before the app went to the background is there after the system ended it")
func draftSurvivesASystemEnd() throws {
    let device = try TestDevice()
    let app = TestApplication(device)
    let editor = DraftEditor(container: device.container)
    try app.application.addDelegate(editor)
    try app.launch()
    #expect(app.application.applicationState == .active)

    editor.draft = "Dear Ann,"
    #expect(app.enterBackground() == .suspended)
    app.endBySystem()

    let relaunched = TestApplication(device)
    let restarted = DraftEditor(container: device.container)
    try relaunched.application.addDelegate(restarted)
    try relaunched.launch()
    #expect(restarted.draft == "Dear Ann,")
}
